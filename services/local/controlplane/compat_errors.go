//go:build !k8s134

package main

import (
	"context"

	"k8s.io/dynamic-resource-allocation/structured"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

// errFailedAllocationOnNode: an allocation error that concerns one node only
// (the scheduler tries the next node); from 1.35.
var errFailedAllocationOnNode = structured.ErrFailedAllocationOnNode

// runPluginManager: from 1.35 PluginManager.Run takes a context.
func runPluginManager(ctx context.Context, pm pluginmanager.PluginManager, ready kubeletconfig.SourcesReady) {
	pm.Run(ctx, ready, ctx.Done())
}
