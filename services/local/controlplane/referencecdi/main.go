// Command reference-cdi generates a claim's CDI spec the way the reference
// NVIDIA DRA driver (github.com/NVIDIA/k8s-dra-driver-gpu,
// cmd/gpu-kubelet-plugin/cdi.go) does, with the same NVIDIA Container
// Toolkit library (pkg/nvcdi) it vendors, over a driver root on disk and a
// mock NVML filled from a facts file. gpudra's tests compare its own spec
// with this one, edit by edit.
//
//	reference-cdi --facts FILE --driver-root DIR --target-driver-root DIR \
//	    --dev-root DIR --nvidia-cdi-hook-path PATH --proc DIR --sysfs DIR \
//	    --claim-uid UID [--mps-pipe-dir DIR --mps-shm-dir DIR] \
//	    [--vfio-api-device] [--vfio-prefer-iommufd] [--host-root DIR] \
//	    --device KIND:NAME:ID [--device ...]
//
// KIND:NAME:ID is gpu:gpu-0:GPU-<uuid>, mig:<name>:MIG-<uuid> or
// vfio:<name>:<pci bus id>. It prints the spec as JSON on stdout (what the
// reference writes to <cdiRoot>/k8s.gpu.nvidia.com-claim_<uid>.yaml) and
// exits 1 with the reason on stderr when the reference would fail the claim.
//
// It is a module of its own because go-nvml needs cgo while the control
// plane is built without it; build.sh builds and caches both.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sirupsen/logrus"
)

type deviceFlag []string

func (d *deviceFlag) String() string     { return strings.Join(*d, ",") }
func (d *deviceFlag) Set(v string) error { *d = append(*d, v); return nil }

type options struct {
	facts, driverRoot, targetDriverRoot, devRoot, hookPath string
	proc, sysfs, hostRoot, claimUID                        string
	mpsPipeDir, mpsShmDir                                  string
	vfioAPIDevice, vfioPreferIommuFD, verbose              bool
	devices                                                deviceFlag
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("reference-cdi", flag.ContinueOnError)
	fs.StringVar(&o.facts, "facts", "", "NVML facts (JSON) for the mock NVML")
	fs.StringVar(&o.driverRoot, "driver-root", "", "the driver root as the plugin sees it (its container driver root)")
	fs.StringVar(&o.targetDriverRoot, "target-driver-root", "/", "the driver root on the host (the reference's nvidiaDriverRoot)")
	fs.StringVar(&o.devRoot, "dev-root", "", "the root holding dev/ (default: the driver root if it has dev/, else /)")
	fs.StringVar(&o.hookPath, "nvidia-cdi-hook-path", "", "nvidia-cdi-hook's path on the host")
	fs.StringVar(&o.proc, "proc", "/proc", "stands in for /proc (MIG capabilities, /proc/devices)")
	fs.StringVar(&o.sysfs, "sysfs", "/sys", "stands in for /sys (VFIO devices)")
	fs.StringVar(&o.hostRoot, "host-root", "", "the host's / (for /dev/iommu; default: the dev root)")
	fs.StringVar(&o.claimUID, "claim-uid", "", "the claim's UID (names the CDI devices)")
	fs.StringVar(&o.mpsPipeDir, "mps-pipe-dir", "", "MPS control daemon pipe directory (MPS sharing)")
	fs.StringVar(&o.mpsShmDir, "mps-shm-dir", "", "MPS control daemon shm directory (MPS sharing)")
	fs.BoolVar(&o.vfioAPIDevice, "vfio-api-device", false, "VfioDeviceConfig iommu: inject the IOMMU API device")
	fs.BoolVar(&o.vfioPreferIommuFD, "vfio-prefer-iommufd", false, "VfioDeviceConfig iommu backend PreferIommuFD")
	fs.BoolVar(&o.verbose, "v", false, "log the toolkit's messages on stderr")
	fs.Var(&o.devices, "device", "KIND:NAME:ID (repeatable)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	var missing []string
	for name, v := range map[string]string{"facts": o.facts, "driver-root": o.driverRoot, "nvidia-cdi-hook-path": o.hookPath, "claim-uid": o.claimUID} {
		if v == "" {
			missing = append(missing, "--"+name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("required: %s", strings.Join(missing, ", "))
	}
	if len(o.devices) == 0 {
		return nil, errors.New("name at least one --device KIND:NAME:ID")
	}
	if (o.mpsPipeDir == "") != (o.mpsShmDir == "") {
		return nil, errors.New("--mps-pipe-dir and --mps-shm-dir go together")
	}
	if o.devRoot == "" {
		o.devRoot = "/"
		if st, err := os.Stat(o.driverRoot + "/dev"); err == nil && st.IsDir() {
			o.devRoot = o.driverRoot
		}
	}
	if o.hostRoot == "" {
		o.hostRoot = o.devRoot
	}
	return o, nil
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "reference-cdi: %v\n", err)
		os.Exit(2)
	}
	logger := logrus.New()
	logger.SetOutput(io.Discard)
	if o.verbose {
		logger.SetOutput(os.Stderr)
		logger.SetLevel(logrus.DebugLevel)
	}
	spec, err := claimSpec(o, logger)
	if err != nil {
		fmt.Fprintf(os.Stderr, "reference-cdi: %v\n", err)
		os.Exit(1)
	}
	out := json.NewEncoder(os.Stdout)
	out.SetIndent("", " ")
	if err := out.Encode(spec); err != nil {
		fmt.Fprintf(os.Stderr, "reference-cdi: %v\n", err)
		os.Exit(1)
	}
}
