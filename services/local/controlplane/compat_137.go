//go:build !k8s134 && !k8s135 && !k8s136

package main

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	resourceclaimregistry "k8s.io/kubernetes/pkg/registry/resource/resourceclaim"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	schedulerfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
)

// claimStrategies: the claim strategy authorizes status writes against the
// resourceclaims/binding and /driver subresources; offline, every write is
// the scheduler's and allowed.
func claimStrategies(ns typedcorev1.NamespaceInterface) (createStrategy, updateStrategy) {
	strategy := resourceclaimregistry.NewStrategy(ns, authorizerfactory.NewAlwaysAllowAuthorizer())
	return strategy, resourceclaimregistry.NewStatusStrategy(strategy)
}

// celFeatures is the CEL environment kube-scheduler builds for these allocator features.
func celFeatures(f structured.Features) cel.Features {
	return cel.Features{EnableConsumableCapacity: f.ConsumableCapacity, EnableListTypeAttributes: f.ListTypeAttributes}
}

// nodeGetter adapts a lister lookup to the DRA manager's GetNodeFunc.
func nodeGetter(get func() (*v1.Node, error)) dra.GetNodeFunc {
	return func(context.Context) (*v1.Node, error) { return get() }
}

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
