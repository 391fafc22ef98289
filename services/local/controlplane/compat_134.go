//go:build k8s134

package main

import (
	"context"
	"errors"

	"k8s.io/dynamic-resource-allocation/structured"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
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

// errFailedAllocationOnNode: 1.34's allocator has no per-node failure error
// (structured.ErrFailedAllocationOnNode came in 1.35): every error it
// returns stops the claim, which errors.Is against this never matches.
var errFailedAllocationOnNode = errors.New("no per-node allocation failures before 1.35")

// runPluginManager: 1.34's PluginManager.Run takes no context.
func runPluginManager(ctx context.Context, pm pluginmanager.PluginManager, ready kubeletconfig.SourcesReady) {
	pm.Run(ready, ctx.Done())
}
