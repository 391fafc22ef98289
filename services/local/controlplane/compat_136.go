//go:build k8s136

package main

import (
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/kubernetes/pkg/features"
)

// celFeatures is the CEL environment kube-scheduler builds for these allocator
// features. 1.36's AllocatorFeatures has no ListTypeAttributes: the scheduler
// reads the gate itself.
func celFeatures(f structured.Features) cel.Features {
	return cel.Features{
		EnableConsumableCapacity: f.ConsumableCapacity,
		EnableListTypeAttributes: utilfeature.DefaultFeatureGate.Enabled(features.DRAListTypeAttributes),
	}
}
