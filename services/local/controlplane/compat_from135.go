//go:build !k8s134

package main

import (
	"context"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/dynamic-resource-allocation/structured"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	schedulerfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
)

// allocatorFeatures: the allocator's features as kube-scheduler derives them.
func allocatorFeatures(fts schedulerfeature.Features) structured.Features {
	return dynamicresources.AllocatorFeatures(fts)
}

// gateDependencies: what each feature gate needs enabled (component-base's table).
func gateDependencies() map[string][]string {
	out := map[string][]string{}
	for feature, deps := range utilfeature.DefaultMutableFeatureGate.Dependencies() {
		for _, dep := range deps {
			out[string(feature)] = append(out[string(feature)], string(dep))
		}
	}
	return out
}

// errFailedAllocationOnNode: an allocation error that concerns one node only
// (the scheduler tries the next node).
var errFailedAllocationOnNode = structured.ErrFailedAllocationOnNode

// runPluginManager: PluginManager.Run takes a context.
func runPluginManager(ctx context.Context, pm pluginmanager.PluginManager, ready kubeletconfig.SourcesReady) {
	pm.Run(ctx, ready, ctx.Done())
}
