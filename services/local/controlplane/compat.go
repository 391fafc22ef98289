package main

// What differs between the Kubernetes releases this binary is built for. The
// default build follows go.mod (the newest, 1.37); build.sh --version 1.N
// selects versions/v1.N/go.mod and the build tag k8s1N. Each compat_*.go file
// holds one side of a change of the Go API, named by the releases it serves:
//
//	compat_134.go     1.34 only               compat_from135.go  1.35 and later
//	compat_upto135.go 1.34 and 1.35           compat_from136.go  1.36 and later
//	compat_136.go     1.36 only               compat_137.go      1.37 (the default)

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
