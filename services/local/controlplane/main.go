// Command controlplane is a multi-call binary holding the Kubernetes 1.35
// control-plane components that gpudra's end-to-end tests run, one component
// per process:
//
//	etcd                     go.etcd.io/etcd/server/v3/etcdmain, unmodified
//	kube-apiserver           k8s.io/kubernetes/cmd/kube-apiserver/app, unmodified
//	kube-scheduler           k8s.io/kubernetes/cmd/kube-scheduler/app, unmodified
//	kube-controller-manager  k8s.io/kubernetes/cmd/kube-controller-manager/app, unmodified
//	kubectl                  k8s.io/kubectl/pkg/cmd, unmodified
//	kubelet                  k8s.io/kubernetes/cmd/kubelet/app, unmodified (real nodes)
//	kubelet-dra              the kubelet's DRA manager and plugin manager for one node
//	reference-allocator      the structured allocator of k8s.io/dynamic-resource-allocation
//	cdi                      a container runtime's CDI loader (tags.cncf.io/container-device-interface)
//	reference-cdi            the reference driver's CDI spec generation (runs the reference-cdi binary)
//
// The component is chosen by the base name of argv[0] (build.sh creates one
// symlink per component next to the binary) or, failing that, by the first
// argument: `controlplane kube-apiserver --help`.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

type component struct {
	run   func() int
	short string
}

var components = map[string]component{
	"etcd":                    {runEtcd, "etcd server (go.etcd.io/etcd/server/v3 etcdmain)"},
	"kube-apiserver":          {runAPIServer, "kube-apiserver"},
	"kube-scheduler":          {runScheduler, "kube-scheduler"},
	"kube-controller-manager": {runControllerManager, "kube-controller-manager"},
	"kubectl":                 {runKubectl, "kubectl"},
	"kubelet":                 {runKubelet, "the kubelet (real nodes: containerd, runc, real containers)"},
	"kubelet-dra":             {runKubeletDRA, "the kubelet's DRA manager + plugin manager for one node"},
	"reference-allocator":     {runReferenceAllocator, "offline structured allocation with the upstream allocator"},
	"cdi":                     {runCDI, "load CDI spec dirs as a container runtime does and inject devices"},
	"reference-cdi":           {runReferenceCDI, "a claim's CDI spec as the reference driver generates it (NVIDIA's nvcdi; separate binary)"},
}

// ComponentNames lists the dispatch names in a stable order.
func componentNames() []string {
	names := make([]string, 0, len(components))
	for name := range components {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: %s COMPONENT [ARGS...]\n\ncomponents:\n", filepath.Base(os.Args[0]))
	for _, name := range componentNames() {
		fmt.Fprintf(os.Stderr, "  %-24s %s\n", name, components[name].short)
	}
	fmt.Fprintf(os.Stderr, "\nA symlink named after a component runs that component.\n")
}

func main() {
	name := strings.TrimSuffix(filepath.Base(os.Args[0]), ".exe")
	if _, ok := components[name]; !ok {
		if len(os.Args) < 2 {
			usage()
			os.Exit(2)
		}
		switch os.Args[1] {
		case "-h", "--help", "help":
			usage()
			os.Exit(0)
		case "list-components":
			for _, n := range componentNames() {
				fmt.Println(n)
			}
			os.Exit(0)
		}
		name = os.Args[1]
		if _, ok := components[name]; !ok {
			fmt.Fprintf(os.Stderr, "unknown component %q\n\n", name)
			usage()
			os.Exit(2)
		}
		// The upstream commands read os.Args themselves (cobra, kubectl's
		// plugin handling, etcd's flag parsing): make it look like they were
		// started under their own name.
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	os.Exit(components[name].run())
}
