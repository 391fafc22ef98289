package main

// The upstream commands, started exactly as their own main packages start
// them (k8s.io/kubernetes/cmd/*/*.go and etcd's server/main.go).

import (
	"context"
	"os"
	_ "time/tzdata" // kube-apiserver / kube-controller-manager: CronJob time zones

	"go.etcd.io/etcd/server/v3/etcdmain"

	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl: client auth plugins
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric registration
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanagerapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	schedulerapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubeletapp "k8s.io/kubernetes/cmd/kubelet/app"
)

func runEtcd() int {
	// etcdmain.Main parses os.Args itself (args[0] is the program name) and
	// exits the process on error.
	etcdmain.Main(os.Args)
	return 0
}

func runAPIServer() int {
	return cli.Run(apiserverapp.NewAPIServerCommand())
}

func runScheduler() int {
	return cli.Run(schedulerapp.NewSchedulerCommand())
}

func runControllerManager() int {
	return cli.Run(controllermanagerapp.NewControllerManagerCommand())
}

func runKubectl() int {
	// As in k8s.io/kubernetes/cmd/kubectl/kubectl.go.
	logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) // nolint:errcheck
	command := kubectlcmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err) // prints the error and exits non-zero
	}
	return 0
}

func runKubelet() int {
	// As in k8s.io/kubernetes/cmd/kubelet/kubelet.go: the whole kubelet, for
	// the real nodes of services/local/node (containerd, runc, real containers).
	return cli.Run(kubeletapp.NewKubeletCommand(context.Background()))
}
