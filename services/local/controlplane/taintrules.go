package main

// DeviceTaintRules for reference-allocator: kube-scheduler does not read them
// itself, its ResourceSlice tracker
// (k8s.io/dynamic-resource-allocation/resourceslice/tracker, applyPatches)
// appends each matching rule's taint to the devices of the slices the
// allocator then sees, when DRADeviceTaintRules is on (DRADeviceTaints in
// 1.34, where the rules were part of that gate). reference-allocator does the
// same with the rules of its input: each is admitted as the API server would
// (defaults, PrepareForCreate, Validate, in whichever version of
// resource.k8s.io the release decodes), then applied to every slice in input
// order. With the gate off the rules are read and validated but change
// nothing, as a scheduler without the tracker's rule handling ignores them.
//
// Release differences kept: up to 1.36 a rule without deviceSelector taints
// every device, from 1.37 none; 1.34's deviceClassName and CEL selectors in a
// rule's selector are refused here (offline runs do not evaluate them).

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"
	"k8s.io/component-base/version"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	resourceinternal "k8s.io/kubernetes/pkg/apis/resource"
	devicetaintruleregistry "k8s.io/kubernetes/pkg/registry/resource/devicetaintrule"
)

// isDeviceTaintRule: a DeviceTaintRule of any resource.k8s.io version this release decodes.
func isDeviceTaintRule(gvk *schema.GroupVersionKind) bool {
	return gvk != nil && gvk.Group == resourceapi.GroupName && gvk.Kind == "DeviceTaintRule"
}

// admitTaintRule runs a decoded DeviceTaintRule through create admission and
// returns it in the internal version.
func admitTaintRule(obj runtime.Object) (*resourceinternal.DeviceTaintRule, error) {
	legacyscheme.Scheme.Default(obj)
	rule := &resourceinternal.DeviceTaintRule{}
	if err := legacyscheme.Scheme.Convert(obj, rule, nil); err != nil {
		return nil, err
	}
	ctx := requestContext("devicetaintrules", "", "create")
	devicetaintruleregistry.Strategy.PrepareForCreate(ctx, rule)
	if errs := devicetaintruleregistry.Strategy.Validate(ctx, rule); len(errs) > 0 {
		msgs := make([]string, 0, len(errs))
		for _, err := range errs {
			msgs = append(msgs, err.Error())
		}
		return nil, errors.New(strings.Join(msgs, "; "))
	}
	if sel := rule.Spec.DeviceSelector; sel != nil {
		// 1.34 only: fields later releases removed.
		v := reflect.ValueOf(sel).Elem()
		for _, name := range []string{"DeviceClassName", "Selectors"} {
			if f := v.FieldByName(name); f.IsValid() && !f.IsZero() {
				return nil, field.Forbidden(field.NewPath("spec", "deviceSelector", "deviceClassName"),
					"reference-allocator does not evaluate device classes or CEL selectors of DeviceTaintRules")
			}
		}
	}
	return rule, nil
}

// taintRulesEnabled: whether the scheduler's slice tracker applies DeviceTaintRules.
func taintRulesEnabled() bool {
	name := featuregate.Feature("DRADeviceTaintRules")
	if _, known := utilfeature.DefaultMutableFeatureGate.GetAll()[name]; !known {
		name = "DRADeviceTaints" // 1.34
	}
	return utilfeature.DefaultFeatureGate.Enabled(name)
}

// nilTaintSelectorMatchesAll: before 1.37 the tracker applied a rule without
// deviceSelector to every device; from 1.37 to none.
func nilTaintSelectorMatchesAll() bool {
	var minor int
	if _, err := fmt.Sscanf(version.Get().Minor, "%d", &minor); err != nil {
		return false
	}
	return minor < 37
}

// applyTaintRules is the tracker's applyPatches over every slice, rules in input order.
func applyTaintRules(slices []*resourceapi.ResourceSlice, rules []*resourceinternal.DeviceTaintRule) {
	matchAll := nilTaintSelectorMatchesAll()
	for _, slice := range slices {
		for _, rule := range rules {
			sel := rule.Spec.DeviceSelector
			if sel == nil && !matchAll {
				continue
			}
			if sel != nil && sel.Driver != nil && *sel.Driver != slice.Spec.Driver {
				continue
			}
			if sel != nil && sel.Pool != nil && *sel.Pool != slice.Spec.Pool.Name {
				continue
			}
			for i := range slice.Spec.Devices {
				device := &slice.Spec.Devices[i]
				if sel != nil && sel.Device != nil && *sel.Device != device.Name {
					continue
				}
				device.Taints = append(device.Taints, resourceapi.DeviceTaint{
					Key:       rule.Spec.Taint.Key,
					Value:     rule.Spec.Taint.Value,
					Effect:    resourceapi.DeviceTaintEffect(rule.Spec.Taint.Effect),
					TimeAdded: rule.Spec.Taint.TimeAdded,
				})
			}
		}
	}
}
