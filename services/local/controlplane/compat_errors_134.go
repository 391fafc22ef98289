//go:build k8s134

package main

import (
	"context"
	"errors"

	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

// errFailedAllocationOnNode: 1.34's allocator has no per-node failure error
// (structured.ErrFailedAllocationOnNode came in 1.35): every error it
// returns stops the claim, which errors.Is against this never matches.
var errFailedAllocationOnNode = errors.New("no per-node allocation failures before 1.35")

// runPluginManager: 1.34's PluginManager.Run takes no context.
func runPluginManager(ctx context.Context, pm pluginmanager.PluginManager, ready kubeletconfig.SourcesReady) {
	pm.Run(ready, ctx.Done())
}
