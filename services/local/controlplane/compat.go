package main

// What differs between the Kubernetes minor versions this binary is built
// for: the default build follows go.mod (the newest); build.sh --version
// selects versions/<minor>/go.mod and the build tag of that minor
// (k8s134, k8s135, k8s136), whose compat_*.go file replaces compat_137.go.

import (
	"context"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// createStrategy and updateStrategy are the parts of the registry
// strategies that admit uses (their concrete types are unexported).
type createStrategy interface {
	PrepareForCreate(ctx context.Context, obj runtime.Object)
	Validate(ctx context.Context, obj runtime.Object) field.ErrorList
}

type updateStrategy interface {
	PrepareForUpdate(ctx context.Context, obj, old runtime.Object)
	ValidateUpdate(ctx context.Context, obj, old runtime.Object) field.ErrorList
}
