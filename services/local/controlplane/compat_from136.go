//go:build !k8s134 && !k8s135

package main

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	resourceclaimregistry "k8s.io/kubernetes/pkg/registry/resource/resourceclaim"
)

// claimStrategies: the claim strategy authorizes status writes against the
// resourceclaims/binding and /driver subresources; offline, every write is
// the scheduler's and allowed.
func claimStrategies(ns typedcorev1.NamespaceInterface) (createStrategy, updateStrategy) {
	strategy := resourceclaimregistry.NewStrategy(ns, authorizerfactory.NewAlwaysAllowAuthorizer())
	return strategy, resourceclaimregistry.NewStatusStrategy(strategy)
}

// nodeGetter adapts a lister lookup to the DRA manager's GetNodeFunc, which
// takes a context from 1.36.
func nodeGetter(get func() (*v1.Node, error)) dra.GetNodeFunc {
	return func(context.Context) (*v1.Node, error) { return get() }
}
