package main

// cdi: load a CDI spec directory exactly as a container runtime does
// (tags.cncf.io/container-device-interface, the library containerd and CRI-O
// use) and inject devices into an OCI spec.
//
//	controlplane cdi --spec-dir DIR [--spec-dir DIR ...] [--oci-spec FILE] DEVICE...
//	controlplane cdi --spec-dir DIR --list
//
// It prints one JSON object on stdout:
//
//	{"specErrors": {"<file>": ["..."]}, "devices": ["vendor/class=name", ...],
//	 "unresolved": [...], "injectError": "...", "ociSpec": {...}}
//
// and exits 0 only when every spec file loaded without error and every
// device was injected. Without --oci-spec the devices go into a minimal OCI
// spec (a process with PATH in its env, an empty Linux section).

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/spf13/pflag"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

type cdiResult struct {
	SpecErrors  map[string][]string `json:"specErrors"`
	Devices     []string            `json:"devices"`
	Unresolved  []string            `json:"unresolved,omitempty"`
	InjectError string              `json:"injectError,omitempty"`
	OCISpec     *oci.Spec           `json:"ociSpec,omitempty"`
}

func runCDI() int {
	flags := pflag.NewFlagSet("cdi", pflag.ContinueOnError)
	specDirs := flags.StringArray("spec-dir", nil, "CDI spec directory (repeatable; later dirs take priority)")
	ociSpecFile := flags.String("oci-spec", "", "OCI runtime spec (config.json) to inject into")
	list := flags.Bool("list", false, "only load the specs and list their devices")
	if err := flags.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if len(*specDirs) == 0 {
		fmt.Fprintln(os.Stderr, "cdi: at least one --spec-dir is required")
		return 2
	}
	devices := flags.Args()
	if !*list && len(devices) == 0 {
		fmt.Fprintln(os.Stderr, "cdi: name the devices to inject, or --list")
		return 2
	}

	cache, err := cdi.NewCache(cdi.WithSpecDirs(*specDirs...), cdi.WithAutoRefresh(false))
	if err != nil && cache == nil {
		fmt.Fprintf(os.Stderr, "cdi: %v\n", err)
		return 1
	}
	result := cdiResult{SpecErrors: map[string][]string{}, Devices: cache.ListDevices()}
	for path, errs := range cache.GetErrors() {
		for _, e := range errs {
			result.SpecErrors[path] = append(result.SpecErrors[path], e.Error())
		}
	}
	sort.Strings(result.Devices)
	ok := len(result.SpecErrors) == 0

	if !*list {
		spec, err := loadOCISpec(*ociSpecFile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "cdi: %v\n", err)
			return 1
		}
		unresolved, err := cache.InjectDevices(spec, devices...)
		result.Unresolved = unresolved
		if err != nil {
			result.InjectError = err.Error()
			ok = false
		} else {
			result.OCISpec = spec
		}
	}

	out := json.NewEncoder(os.Stdout)
	out.SetIndent("", "  ")
	if err := out.Encode(result); err != nil {
		fmt.Fprintf(os.Stderr, "cdi: %v\n", err)
		return 1
	}
	if !ok {
		return 1
	}
	return 0
}

func loadOCISpec(path string) (*oci.Spec, error) {
	if path == "" {
		return &oci.Spec{
			Version: oci.Version,
			Process: &oci.Process{Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}},
			Linux:   &oci.Linux{},
		}, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	spec := &oci.Spec{}
	if err := json.Unmarshal(data, spec); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return spec, nil
}
