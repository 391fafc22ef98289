//go:build k8s134

package main

import (
	"k8s.io/dynamic-resource-allocation/structured"
	schedulerfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
)

// allocatorFeatures: what kube-scheduler 1.34 passes to NewAllocator
// (dynamicresources.go, PostFilter's allocator; AllocatorFeatures came in 1.35).
func allocatorFeatures(fts schedulerfeature.Features) structured.Features {
	return structured.Features{
		AdminAccess:          fts.EnableDRAAdminAccess,
		PrioritizedList:      fts.EnableDRAPrioritizedList,
		PartitionableDevices: fts.EnablePartitionableDevices,
		DeviceTaints:         fts.EnableDRADeviceTaints,
		DeviceBinding:        fts.EnableDRADeviceBindingConditions,
		DeviceStatus:         fts.EnableDRAResourceClaimDeviceStatus,
		ConsumableCapacity:   fts.EnableConsumableCapacity,
	}
}

// gateDependencies: 1.34's feature gates have no dependency table.
func gateDependencies() map[string][]string {
	return nil
}
