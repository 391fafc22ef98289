//go:build k8s134 || k8s135

package main

import (
	v1 "k8s.io/api/core/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	resourceclaimregistry "k8s.io/kubernetes/pkg/registry/resource/resourceclaim"
)

// claimStrategies: before 1.36 status writes are not authorized per subresource.
func claimStrategies(ns typedcorev1.NamespaceInterface) (createStrategy, updateStrategy) {
	strategy := resourceclaimregistry.NewStrategy(ns)
	return strategy, resourceclaimregistry.NewStatusStrategy(strategy)
}

// celFeatures is the CEL environment kube-scheduler builds for these allocator
// features (no list-type attributes before 1.36).
func celFeatures(f structured.Features) cel.Features {
	return cel.Features{EnableConsumableCapacity: f.ConsumableCapacity}
}

// nodeGetter: the DRA manager's GetNodeFunc takes no context before 1.36.
func nodeGetter(get func() (*v1.Node, error)) dra.GetNodeFunc {
	return get
}
