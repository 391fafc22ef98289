package main

// A mock NVML (github.com/NVIDIA/go-nvml/pkg/nvml/mock) answering from a facts
// file, so that NVIDIA's CDI library sees the same GPUs as gpudra's preparer.

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// facts is what tests/helpers/driverroot.py writes as facts.json.
type facts struct {
	DriverVersion     string    `json:"driverVersion"`
	CudaDriverVersion int       `json:"cudaDriverVersion"`
	Gpus              []gpuFact `json:"gpus"`
}

type gpuFact struct {
	Index                 int       `json:"index"`
	UUID                  string    `json:"uuid"`
	Minor                 int       `json:"minor"`
	PciBusID              string    `json:"pciBusId"`
	PciDeviceID           uint32    `json:"pciDeviceId"`
	Name                  string    `json:"name"`
	Brand                 string    `json:"brand"`
	Architecture          string    `json:"architecture"`
	CudaComputeCapability [2]int    `json:"cudaComputeCapability"`
	MemoryMiB             uint64    `json:"memoryMiB"`
	MigEnabled            bool      `json:"migEnabled"`
	MigDevices            []migFact `json:"migDevices"`
}

type migFact struct {
	UUID           string `json:"uuid"`
	GiID           int    `json:"giId"`
	CiID           int    `json:"ciId"`
	Profile        string `json:"profile"`
	GiProfileID    int    `json:"giProfileId"`
	PlacementStart int    `json:"placementStart"`
	PlacementSize  int    `json:"placementSize"`
}

func loadFacts(path string) (*facts, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f facts
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if f.DriverVersion == "" || len(f.Gpus) == 0 {
		return nil, fmt.Errorf("%s: want driverVersion and at least one GPU", path)
	}
	return &f, nil
}

var architectures = map[string]nvml.DeviceArchitecture{
	"Ampere":       nvml.DEVICE_ARCH_AMPERE,
	"Ada Lovelace": nvml.DEVICE_ARCH_ADA,
	"Hopper":       nvml.DEVICE_ARCH_HOPPER,
	"Blackwell":    nvml.DEVICE_ARCH_BLACKWELL,
}

// nvmlBusID is NVML's form of a PCI bus id: an 8-digit domain, upper case.
func nvmlBusID(bdf string) [32]uint8 {
	var out [32]uint8
	for i, c := range strings.ToUpper("0000" + bdf) {
		out[i] = uint8(c)
	}
	return out
}

func newMockNVML(f *facts) (nvml.Interface, error) {
	var devices []*mock.Device
	byUUID := map[string]*mock.Device{}
	for _, g := range f.Gpus {
		g := g
		arch, ok := architectures[g.Architecture]
		if !ok {
			return nil, fmt.Errorf("GPU %s: unknown architecture %q", g.UUID, g.Architecture)
		}
		parent := &mock.Device{}
		var migs []*mock.Device
		for _, m := range g.MigDevices {
			m := m
			mig := &mock.Device{
				GetUUIDFunc:                            func() (string, nvml.Return) { return m.UUID, nvml.SUCCESS },
				IsMigDeviceHandleFunc:                  func() (bool, nvml.Return) { return true, nvml.SUCCESS },
				GetGpuInstanceIdFunc:                   func() (int, nvml.Return) { return m.GiID, nvml.SUCCESS },
				GetComputeInstanceIdFunc:               func() (int, nvml.Return) { return m.CiID, nvml.SUCCESS },
				GetDeviceHandleFromMigDeviceHandleFunc: func() (nvml.Device, nvml.Return) { return parent, nvml.SUCCESS },
				GetMinorNumberFunc:                     func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED },
				GetNameFunc: func() (string, nvml.Return) {
					return fmt.Sprintf("%s MIG %s", g.Name, m.Profile), nvml.SUCCESS
				},
			}
			migs = append(migs, mig)
			byUUID[m.UUID] = mig
		}
		*parent = mock.Device{
			GetUUIDFunc:           func() (string, nvml.Return) { return g.UUID, nvml.SUCCESS },
			GetIndexFunc:          func() (int, nvml.Return) { return g.Index, nvml.SUCCESS },
			GetMinorNumberFunc:    func() (int, nvml.Return) { return g.Minor, nvml.SUCCESS },
			GetNameFunc:           func() (string, nvml.Return) { return g.Name, nvml.SUCCESS },
			GetArchitectureFunc:   func() (nvml.DeviceArchitecture, nvml.Return) { return arch, nvml.SUCCESS },
			IsMigDeviceHandleFunc: func() (bool, nvml.Return) { return false, nvml.SUCCESS },
			GetBrandFunc:          func() (nvml.BrandType, nvml.Return) { return nvml.BRAND_NVIDIA, nvml.SUCCESS },
			GetCudaComputeCapabilityFunc: func() (int, int, nvml.Return) {
				return g.CudaComputeCapability[0], g.CudaComputeCapability[1], nvml.SUCCESS
			},
			GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
				return nvml.Memory{Total: g.MemoryMiB << 20}, nvml.SUCCESS
			},
			GetPciInfoFunc: func() (nvml.PciInfo, nvml.Return) {
				return nvml.PciInfo{BusId: nvmlBusID(g.PciBusID), PciDeviceId: g.PciDeviceID<<16 | 0x10de}, nvml.SUCCESS
			},
			GetMigModeFunc: func() (int, int, nvml.Return) {
				if g.MigEnabled {
					return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS
				}
				return nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_DISABLE, nvml.SUCCESS
			},
			GetMaxMigDeviceCountFunc: func() (int, nvml.Return) { return len(migs), nvml.SUCCESS },
			GetMigDeviceHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
				if i < 0 || i >= len(migs) {
					return nil, nvml.ERROR_NOT_FOUND
				}
				return migs[i], nvml.SUCCESS
			},
		}
		devices = append(devices, parent)
		byUUID[g.UUID] = parent
	}
	lib := &mock.Interface{
		InitFunc:                       func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:                   func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc:     func() (string, nvml.Return) { return f.DriverVersion, nvml.SUCCESS },
		SystemGetCudaDriverVersionFunc: func() (int, nvml.Return) { return f.CudaDriverVersion, nvml.SUCCESS },
		DeviceGetCountFunc:             func() (int, nvml.Return) { return len(devices), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= len(devices) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return devices[i], nvml.SUCCESS
		},
		DeviceGetHandleByUUIDFunc: func(uuid string) (nvml.Device, nvml.Return) {
			if d, ok := byUUID[uuid]; ok {
				return d, nvml.SUCCESS
			}
			return nil, nvml.ERROR_NOT_FOUND
		},
	}
	return lib, nil
}
