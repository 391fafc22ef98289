package main

// The reference driver's CreateClaimSpecFile, composed from the same calls:
// nvcdi common edits (cached once per node there), nvcdi device specs by GPU
// UUID, a MIG device as its parent's spec plus the GI/CI capability nodes
// read from /proc, MPS edits appended to the device's, VFIO device nodes
// from sysfs with the VFIO common edits replacing nvcdi's, then the
// transform that rewrites the container driver root to the host's.

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	nvdevice "github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvlib/pkg/nvpci"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	nvspec "github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/spec"
	transformroot "github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/transform/root"
	"github.com/sirupsen/logrus"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

const (
	cdiVendor     = "k8s.gpu.nvidia.com"
	cdiClaimClass = "claim"
)

func claimSpec(o *options, logger *logrus.Logger) (*cdispec.Spec, error) {
	f, err := loadFacts(o.facts)
	if err != nil {
		return nil, err
	}
	nvmllib, err := newMockNVML(f)
	if err != nil {
		return nil, err
	}
	lib, err := nvcdi.New(
		nvcdi.WithDeviceLib(nvdevice.New(nvmllib)),
		nvcdi.WithDriverRoot(o.driverRoot),
		nvcdi.WithDevRoot(o.devRoot),
		nvcdi.WithLogger(logger),
		nvcdi.WithNvmlLib(nvmllib),
		nvcdi.WithMode("nvml"),
		nvcdi.WithVendor(cdiVendor),
		nvcdi.WithClass(cdiClaimClass),
		nvcdi.WithNVIDIACDIHookPath(o.hookPath),
		nvcdi.WithFeatureFlags(nvcdi.FeatureDisableNvsandboxUtils),
	)
	if err != nil {
		return nil, fmt.Errorf("unable to create CDI library for claims: %w", err)
	}
	commonEdits, err := lib.GetCommonEdits()
	if err != nil {
		return nil, fmt.Errorf("failed to get common CDI spec edits: %w", err)
	}

	var devices []cdispec.Device
	for _, arg := range o.devices {
		kind, name, id, ok := splitDevice(arg)
		if !ok {
			return nil, fmt.Errorf("--device %q: want KIND:NAME:ID", arg)
		}
		dname := fmt.Sprintf("%s-%s", o.claimUID, name)
		var dspec cdispec.Device
		switch kind {
		case "gpu", "mig":
			uuid, mig := id, (*migFact)(nil)
			minor := 0
			if kind == "mig" {
				if mig, uuid, minor = findMig(f, id); mig == nil {
					return nil, fmt.Errorf("--device %q: no MIG device %s in the facts", arg, id)
				}
			}
			specs, err := lib.GetDeviceSpecsByID(uuid)
			if err != nil {
				return nil, fmt.Errorf("unable to get device spec for %s: %w", dname, err)
			}
			dspec = specs[0]
			if mig != nil {
				nodes, err := migCapNodes(o.proc, minor, mig.GiID, mig.CiID)
				if err != nil {
					return nil, fmt.Errorf("failed to construct MIG device DeviceNode edits: %w", err)
				}
				dspec.ContainerEdits.DeviceNodes = append(dspec.ContainerEdits.DeviceNodes, nodes...)
			}
			if o.mpsPipeDir != "" {
				edits := (&cdiapi.ContainerEdits{ContainerEdits: &dspec.ContainerEdits}).Append(mpsEdits(o))
				dspec.ContainerEdits = *edits.ContainerEdits
			}
		case "vfio":
			dspec, err = vfioDeviceSpec(o, id)
			if err != nil {
				return nil, fmt.Errorf("failed to get CDI container edits for vfio device: %w", err)
			}
			commonEdits = vfioCommonEdits(o)
		default:
			return nil, fmt.Errorf("--device %q: kind must be gpu, mig or vfio", arg)
		}
		dspec.Name = dname
		devices = append(devices, dspec)
	}

	spec, err := nvspec.New(
		nvspec.WithVendor(cdiVendor),
		nvspec.WithClass(cdiClaimClass),
		nvspec.WithDeviceSpecs(devices),
		nvspec.WithEdits(*commonEdits.ContainerEdits),
	)
	if err != nil {
		return nil, fmt.Errorf("failed to create CDI spec: %w", err)
	}
	err = transformroot.New(
		transformroot.WithRoot(o.driverRoot),
		transformroot.WithTargetRoot(o.targetDriverRoot),
		transformroot.WithRelativeTo("host"),
	).Transform(spec.Raw())
	if err != nil {
		return nil, fmt.Errorf("failed to transform driver root in CDI spec: %w", err)
	}
	return spec.Raw(), nil
}

func splitDevice(arg string) (kind, name, id string, ok bool) {
	parts := strings.SplitN(arg, ":", 3)
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

// findMig returns the MIG device, its parent's UUID and its parent's minor.
func findMig(f *facts, uuid string) (*migFact, string, int) {
	for _, g := range f.Gpus {
		for i := range g.MigDevices {
			if g.MigDevices[i].UUID == uuid {
				return &g.MigDevices[i], g.UUID, g.Minor
			}
		}
	}
	return nil, "", 0
}

// mpsEdits is the reference's MpsControlDaemon.GetCDIContainerEdits.
func mpsEdits(o *options) *cdiapi.ContainerEdits {
	opts := []string{"rw", "nosuid", "nodev", "bind"}
	return &cdiapi.ContainerEdits{ContainerEdits: &cdispec.ContainerEdits{
		Env: []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"},
		Mounts: []*cdispec.Mount{
			{ContainerPath: "/dev/shm", HostPath: o.mpsShmDir, Options: opts},
			{ContainerPath: "/tmp/nvidia-mps", HostPath: o.mpsPipeDir, Options: opts},
		},
	}}
}

// migCapNodes is the reference's GetDevNodesForMigDevice over common.ParseNVCapDeviceInfo.
func migCapNodes(proc string, gpuMinor, gi, ci int) ([]*cdispec.DeviceNode, error) {
	caps := filepath.Join(proc, "driver/nvidia/capabilities")
	major, err := deviceMajor(filepath.Join(proc, "devices"), "nvidia-caps")
	if err != nil {
		return nil, err
	}
	var nodes []*cdispec.DeviceNode
	for _, p := range []string{
		fmt.Sprintf("%s/gpu%d/mig/gi%d/access", caps, gpuMinor, gi),
		fmt.Sprintf("%s/gpu%d/mig/gi%d/ci%d/access", caps, gpuMinor, gi, ci),
	} {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var minor, mode int
		for _, line := range strings.Split(string(data), "\n") {
			key, value, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			switch strings.TrimSpace(key) {
			case "DeviceFileMinor":
				_, _ = fmt.Sscanf(strings.TrimSpace(value), "%d", &minor)
			case "DeviceFileMode":
				_, _ = fmt.Sscanf(strings.TrimSpace(value), "%d", &mode)
			}
		}
		fileMode := os.FileMode(mode)
		nodes = append(nodes, &cdispec.DeviceNode{
			Path:     fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor),
			Type:     "c",
			FileMode: &fileMode,
			Major:    int64(major),
			Minor:    int64(minor),
		})
	}
	return nodes, nil
}

func deviceMajor(procDevices, name string) (int, error) {
	re := regexp.MustCompile("(?s)Character devices:.*?([0-9]+) " + regexp.QuoteMeta(name) + "\n.*Block devices:")
	data, err := os.ReadFile(procDevices)
	if err != nil {
		return -1, err
	}
	m := re.FindStringSubmatch(string(data))
	if len(m) != 2 {
		return -1, fmt.Errorf("error parsing %q: no %s", procDevices, name)
	}
	return strconv.Atoi(m[1])
}

// iommuFDEnabled is the reference's checkIommuFDEnabled: /dev/iommu exists on the host.
func iommuFDEnabled(o *options) bool {
	_, err := os.Stat(filepath.Join(o.hostRoot, "dev/iommu"))
	return err == nil
}

// vfioCommonEdits is the reference's vfioCDIHandler.GetCommonEdits.
func vfioCommonEdits(o *options) *cdiapi.ContainerEdits {
	edits := &cdiapi.ContainerEdits{ContainerEdits: &cdispec.ContainerEdits{
		Env:         []string{"NVIDIA_VISIBLE_DEVICES=void"},
		DeviceNodes: []*cdispec.DeviceNode{},
	}}
	if !o.vfioAPIDevice {
		return edits
	}
	path := "/dev/vfio/vfio"
	if o.vfioPreferIommuFD && iommuFDEnabled(o) {
		path = "/dev/iommu"
	}
	edits.DeviceNodes = append(edits.DeviceNodes, &cdispec.DeviceNode{Path: path})
	return edits
}

// vfioDeviceSpec is the reference's vfioCDIHandler.GetDeviceSpecsByPCIBusID.
func vfioDeviceSpec(o *options, pciBusID string) (cdispec.Device, error) {
	lib := nvpci.New(nvpci.WithPCIDevicesRoot(filepath.Join(o.sysfs, "bus/pci/devices")))
	info, err := lib.GetGPUByPciBusID(pciBusID)
	if err != nil {
		return cdispec.Device{}, fmt.Errorf("error getting PCI device info for GPU %q: %w", pciBusID, err)
	}
	if info == nil {
		return cdispec.Device{}, fmt.Errorf("no NVIDIA GPU at %q", pciBusID)
	}
	var node *cdispec.DeviceNode
	if o.vfioPreferIommuFD && iommuFDEnabled(o) {
		if !strings.HasPrefix(info.IommuFD, "vfio") {
			return cdispec.Device{}, fmt.Errorf("missing iommufd cdev for GPU %q", info.Address)
		}
		node = &cdispec.DeviceNode{Path: filepath.Join("/dev/vfio/devices", info.IommuFD)}
	} else {
		node = &cdispec.DeviceNode{Path: fmt.Sprintf("/dev/vfio/%d", info.IommuGroup)}
	}
	return cdispec.Device{ContainerEdits: cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{node}}}, nil
}
