package main

// reference-allocator: offline structured allocation with the allocator that
// kube-scheduler 1.35 uses (k8s.io/dynamic-resource-allocation/structured),
// behind the same command line as `gpudra allocate`:
//
//	reference-allocator -f FILE [-f FILE ...] [--node NODE]
//	                    [--feature-gates NAME=bool,...] [-o json|yaml|text]
//
// Input: YAML (several documents) or JSON (one object or a kind: List) with
// resource.k8s.io/v1 DeviceClass, ResourceSlice and ResourceClaim objects and
// optionally v1 Node objects (labels for node selectors) and v1 Namespace
// objects (labels for the adminAccess check; a namespace not given allows
// adminAccess), and DeviceTaintRules (taintrules.go: applied to the slices as
// kube-scheduler's slice tracker applies them). Objects are decoded strictly
// and go through what the API server does on create (defaults, the registry strategies' PrepareForCreate,
// which drops fields of disabled features, and validation). Claims with status.allocation count as allocated;
// the others are allocated in input order, each seeing the results before it.
// With --node only that node is tried, otherwise every node the input names
// (Node objects, nodeName of slices and devices) in name order, and the first
// that fits wins; with no node named at all, one anonymous node (output node:
// null).
//
// Feature gates are Kubernetes' own (defaults of 1.35); the allocator features
// are derived from them exactly as kube-scheduler derives them.
//
// Exit status: 0 whenever the input was read, whatever the outcome; 2 for
// unusable input or arguments (the message names the file and document).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sort"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/component-base/featuregate"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	serializerjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apiserver/pkg/authentication/user"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	resourceinternal "k8s.io/kubernetes/pkg/apis/resource"
	_ "k8s.io/kubernetes/pkg/apis/resource/install" // defaults + conversions for resource.k8s.io
	deviceclassregistry "k8s.io/kubernetes/pkg/registry/resource/deviceclass"
	resourcesliceregistry "k8s.io/kubernetes/pkg/registry/resource/resourceslice"
	schedulerfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// allocateOutput is the document printed by -o json / -o yaml.
type allocateOutput struct {
	Claims []claimOutcome `json:"claims"`
}

type claimOutcome struct {
	Namespace   string                        `json:"namespace"`
	Name        string                        `json:"name"`
	Status      string                        `json:"status"` // allocated | unschedulable | error
	Node        *string                       `json:"node"`
	Allocation  *resourceapi.AllocationResult `json:"allocation"`
	Error       *string                       `json:"error"`
	Explanation *string                       `json:"explanation"`
}

const (
	statusAllocated     = "allocated"
	statusUnschedulable = "unschedulable"
	statusError         = "error"
)

type inputError struct{ msg string }

func (e *inputError) Error() string { return e.msg }

func inputErrorf(format string, args ...any) error {
	return &inputError{msg: fmt.Sprintf(format, args...)}
}

type allocatorInput struct {
	objects    []decodedObject // in input order
	nodes      map[string]*v1.Node
	namespaces map[string]*v1.Namespace

	// Admitted objects.
	classes map[string]*resourceapi.DeviceClass
	slices  []*resourceapi.ResourceSlice
	claims  []*resourceapi.ResourceClaim

	taintRuleObjects []decodedObject // DeviceTaintRules as decoded, admitted last
	taintRules       []*resourceinternal.DeviceTaintRule
}

func runReferenceAllocator() (code int) {
	// A Go panic exits with 2, which here means "invalid input": report
	// internal failures as 1 instead.
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(os.Stderr, "reference-allocator: internal error: %v\n%s", r, debug.Stack())
			code = 1
		}
	}()
	fs := pflag.NewFlagSet("reference-allocator", pflag.ContinueOnError)
	files := fs.StringArrayP("filename", "f", nil, "input file (YAML or JSON; '-' for stdin); repeatable")
	node := fs.String("node", "", "allocate on this node only")
	output := fs.StringP("output", "o", "text", "output format: json, yaml or text")
	listGates := fs.Bool("list-feature-gates", false, "print this release's DRA feature gates as JSON and exit")
	utilfeature.DefaultMutableFeatureGate.AddFlag(fs)
	goflags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(goflags)
	fs.AddGoFlagSet(goflags)
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: reference-allocator -f FILE [-f FILE ...] [--node NODE] [--feature-gates NAME=bool,...] [-o json|yaml|text]\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "reference-allocator:", err)
		return 2
	}
	if *listGates {
		return printFeatureGates()
	}
	if len(*files) == 0 || fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	switch *output {
	case "json", "yaml", "text":
	default:
		fmt.Fprintf(os.Stderr, "reference-allocator: unknown output format %q (json, yaml, text)\n", *output)
		return 2
	}

	input := &allocatorInput{
		classes:    map[string]*resourceapi.DeviceClass{},
		nodes:      map[string]*v1.Node{},
		namespaces: map[string]*v1.Namespace{},
	}
	for _, file := range *files {
		if err := input.readFile(file); err != nil {
			fmt.Fprintln(os.Stderr, "reference-allocator:", err)
			return 2
		}
	}
	if err := input.admit(); err != nil {
		fmt.Fprintln(os.Stderr, "reference-allocator:", err)
		return 2
	}

	features := allocatorFeatures(schedulerfeature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate))
	result := allocateAll(context.Background(), input, *node, features)

	var err error
	switch *output {
	case "json":
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(result)
	case "yaml":
		var data []byte
		if data, err = yaml.Marshal(result); err == nil {
			_, err = os.Stdout.Write(data)
		}
	case "text":
		err = printText(os.Stdout, result)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "reference-allocator: write output:", err)
		return 1
	}
	return 0
}

// gateInfo is one feature gate as this release's components see it.
type gateInfo struct {
	Default    bool     `json:"default"`
	Locked     bool     `json:"locked"`
	PreRelease string   `json:"preRelease"`
	Needs      []string `json:"needs"`
}

// printFeatureGates prints the DRA gates (and the gates they depend on) with
// their defaults, locks and dependencies, for tests that compare gpudra's
// per-version tables with the release itself.
func printFeatureGates() int {
	all := utilfeature.DefaultMutableFeatureGate.GetAll()
	deps := gateDependencies()
	gates := map[string]gateInfo{}
	var add func(name string)
	add = func(name string) {
		if _, done := gates[name]; done {
			return
		}
		spec := all[featuregate.Feature(name)]
		needs := append([]string{}, deps[name]...)
		sort.Strings(needs)
		gates[name] = gateInfo{Default: spec.Default, Locked: spec.LockToDefault, PreRelease: string(spec.PreRelease), Needs: needs}
		for _, dep := range needs {
			add(dep)
		}
	}
	for name := range all {
		if strings.HasPrefix(string(name), "DRA") || name == "DynamicResourceAllocation" {
			add(string(name))
		}
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(gates); err != nil {
		fmt.Fprintln(os.Stderr, "reference-allocator:", err)
		return 1
	}
	return 0
}

// ---- input ----

var strictDecoder = serializerjson.NewSerializerWithOptions(serializerjson.DefaultMetaFactory,
	clientscheme.Scheme, clientscheme.Scheme, serializerjson.SerializerOptions{Strict: true})

// decodedObject is one input object and where it came from.
type decodedObject struct {
	where string
	obj   runtime.Object
}

func (in *allocatorInput) readFile(file string) error {
	var r io.Reader
	if file == "-" {
		r = os.Stdin
	} else {
		f, err := os.Open(file)
		if err != nil {
			return inputErrorf("%s: %v", file, err)
		}
		defer f.Close()
		r = f
	}
	// Read it whole and end it with a newline: the YAML reader drops a last
	// line without one whose length is a multiple of its 4096-byte buffer
	// (a compact JSON file of 12288 bytes read as nothing).
	content, err := io.ReadAll(r)
	if err != nil {
		return inputErrorf("%s: %v", file, err)
	}
	if len(content) > 0 && content[len(content)-1] != '\n' {
		content = append(content, '\n')
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(content)))
	for doc := 1; ; doc++ {
		data, err := reader.Read()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return inputErrorf("%s: document %d: %v", file, doc, err)
		}
		where := fmt.Sprintf("%s: document %d", file, doc)
		jsonData, err := yaml.YAMLToJSON(data)
		if err != nil {
			return inputErrorf("%s: %v", where, err)
		}
		jsonData = bytes.TrimSpace(jsonData)
		if len(jsonData) == 0 || string(jsonData) == "null" {
			continue
		}
		if err := in.addDocument(where, jsonData); err != nil {
			return err
		}
	}
}

func (in *allocatorInput) addDocument(where string, data []byte) error {
	var meta struct {
		Kind  string            `json:"kind"`
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(data, &meta); err != nil {
		return inputErrorf("%s: not an object: %v", where, err)
	}
	if meta.Kind == "List" || (strings.HasSuffix(meta.Kind, "List") && meta.Items != nil) {
		for i, item := range meta.Items {
			if err := in.decode(fmt.Sprintf("%s, item %d", where, i+1), item); err != nil {
				return err
			}
		}
		return nil
	}
	return in.decode(where, data)
}

func (in *allocatorInput) decode(where string, data []byte) error {
	obj, gvk, err := strictDecoder.Decode(data, nil, nil)
	if err != nil {
		return inputErrorf("%s: %v", where, err)
	}
	if isDeviceTaintRule(gvk) {
		in.taintRuleObjects = append(in.taintRuleObjects, decodedObject{where: where, obj: obj})
		return nil
	}
	switch o := obj.(type) {
	case *resourceapi.DeviceClass, *resourceapi.ResourceSlice, *resourceapi.ResourceClaim:
	case *v1.Node:
		if o.Name == "" {
			return inputErrorf("%s: Node without metadata.name", where)
		}
		in.nodes[o.Name] = o
	case *v1.Namespace:
		if o.Name == "" {
			return inputErrorf("%s: Namespace without metadata.name", where)
		}
		in.namespaces[o.Name] = o
	default:
		return inputErrorf("%s: unsupported object %s (want resource.k8s.io/v1 DeviceClass, ResourceSlice, ResourceClaim, or v1 Node, Namespace)", where, gvk)
	}
	in.objects = append(in.objects, decodedObject{where: where, obj: obj})
	return nil
}

// namespaceGetter answers the API server's admin-access check
// (pkg/registry/resource AuthorizedForAdmin): a Namespace from the input
// as given, any other namespace as one that carries
// resource.kubernetes.io/admin-access=true, so that offline what-if runs
// can use adminAccess without writing Namespaces.
type namespaceGetter struct {
	typedcorev1.NamespaceInterface // only Get is used
	namespaces                     map[string]*v1.Namespace
}

func (g namespaceGetter) Get(_ context.Context, name string, _ metav1.GetOptions) (*v1.Namespace, error) {
	if ns, ok := g.namespaces[name]; ok {
		return ns, nil
	}
	return &v1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:   name,
		Labels: map[string]string{resourceinternal.DRAAdminNamespaceLabelKey: "true"},
	}}, nil
}

// requestContext is a request by the scheduler's user: from 1.36 the claim
// status strategy authorizes status writes against the caller (an offline
// run allows every write, see claimStrategies).
func requestContext(resource, subresource, verb string) context.Context {
	ctx := genericapirequest.WithUser(context.Background(), &user.DefaultInfo{Name: "system:kube-scheduler"})
	return genericapirequest.WithRequestInfo(ctx, &genericapirequest.RequestInfo{
		IsResourceRequest: true,
		Verb:              verb,
		APIGroup:          resourceapi.GroupName,
		APIVersion:        "v1",
		Resource:          resource,
		Subresource:       subresource,
	})
}

// admit passes every object through what the API server does on create:
// defaulting, the registry strategy's PrepareForCreate (which drops fields
// of disabled features) and Validate; a claim with status goes on through
// the status strategy's PrepareForUpdate and ValidateUpdate, as when the
// scheduler wrote that status. The objects the allocator gets are the
// results, converted back to resource.k8s.io/v1.
func (in *allocatorInput) admit() error {
	claimStrategy, claimStatusStrategy := claimStrategies(namespaceGetter{namespaces: in.namespaces})
	for _, d := range in.objects {
		switch o := d.obj.(type) {
		case *resourceapi.DeviceClass:
			legacyscheme.Scheme.Default(o)
			internal := &resourceinternal.DeviceClass{}
			ctx := requestContext("deviceclasses", "", "create")
			err := roundTrip(o, internal, func() field.ErrorList {
				deviceclassregistry.Strategy.PrepareForCreate(ctx, internal)
				return deviceclassregistry.Strategy.Validate(ctx, internal)
			})
			if err != nil {
				return inputErrorf("%s: DeviceClass %s: %v", d.where, o.Name, err)
			}
			if _, dup := in.classes[o.Name]; dup {
				return inputErrorf("%s: DeviceClass %s given twice", d.where, o.Name)
			}
			in.classes[o.Name] = o
		case *resourceapi.ResourceSlice:
			legacyscheme.Scheme.Default(o)
			internal := &resourceinternal.ResourceSlice{}
			ctx := requestContext("resourceslices", "", "create")
			err := roundTrip(o, internal, func() field.ErrorList {
				resourcesliceregistry.Strategy.PrepareForCreate(ctx, internal)
				return resourcesliceregistry.Strategy.Validate(ctx, internal)
			})
			if err != nil {
				return inputErrorf("%s: ResourceSlice %s: %v", d.where, o.Name, err)
			}
			in.slices = append(in.slices, o)
		case *resourceapi.ResourceClaim:
			if o.Namespace == "" {
				o.Namespace = metav1.NamespaceDefault
			}
			legacyscheme.Scheme.Default(o)
			internal := &resourceinternal.ResourceClaim{}
			err := roundTrip(o, internal, func() field.ErrorList {
				status := internal.Status
				ctx := requestContext("resourceclaims", "", "create")
				claimStrategy.PrepareForCreate(ctx, internal)
				if errs := claimStrategy.Validate(ctx, internal); len(errs) > 0 {
					return errs
				}
				if status.Allocation == nil && len(status.ReservedFor) == 0 && len(status.Devices) == 0 {
					return nil
				}
				if internal.ResourceVersion == "" {
					internal.ResourceVersion = "1" // update validation wants one
				}
				old := internal.DeepCopy()
				internal.Status = status
				ctx = requestContext("resourceclaims", "status", "update")
				claimStatusStrategy.PrepareForUpdate(ctx, internal, old)
				return claimStatusStrategy.ValidateUpdate(ctx, internal, old)
			})
			if err != nil {
				return inputErrorf("%s: ResourceClaim %s/%s: %v", d.where, o.Namespace, o.Name, err)
			}
			for _, other := range in.claims {
				if other.Namespace == o.Namespace && other.Name == o.Name {
					return inputErrorf("%s: ResourceClaim %s/%s given twice", d.where, o.Namespace, o.Name)
				}
			}
			if o.UID == "" {
				o.UID = types.UID(fmt.Sprintf("reference-allocator-%d", len(in.claims)+1))
			}
			in.claims = append(in.claims, o)
		}
	}
	for _, d := range in.taintRuleObjects {
		rule, err := admitTaintRule(d.obj)
		if err != nil {
			return inputErrorf("%s: DeviceTaintRule: %v", d.where, err)
		}
		in.taintRules = append(in.taintRules, rule)
	}
	if taintRulesEnabled() {
		applyTaintRules(in.slices, in.taintRules)
	}
	return nil
}

// roundTrip converts a v1 object to its internal type, runs admit on it and
// converts the result back into the v1 object.
func roundTrip(obj runtime.Object, internal runtime.Object, admit func() field.ErrorList) error {
	if err := legacyscheme.Scheme.Convert(obj, internal, nil); err != nil {
		return err
	}
	if errs := admit(); len(errs) > 0 {
		msgs := make([]string, 0, len(errs))
		for _, err := range errs {
			msgs = append(msgs, err.Error())
		}
		return errors.New(strings.Join(msgs, "; "))
	}
	return legacyscheme.Scheme.Convert(internal, obj, nil)
}

// ---- allocation ----

type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	names := make([]string, 0, len(l))
	for name := range l {
		names = append(names, name)
	}
	sort.Strings(names)
	classes := make([]*resourceapi.DeviceClass, 0, len(l))
	for _, name := range names {
		classes = append(classes, l[name])
	}
	return classes, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if class, ok := l[name]; ok {
		return class, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Group: resourceapi.GroupName, Resource: "deviceclasses"}, name)
}

func newNode(name string) *v1.Node {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if name != "" {
		node.Labels = map[string]string{v1.LabelHostname: name}
	}
	return node
}

// candidateNodes: --node, else every node the input names (Node objects,
// the nodeName of slices and of devices), in name order, else one anonymous
// node without labels (which only allNodes / selector-less slices can serve).
// A node known only by name gets the kubernetes.io/hostname label a kubelet
// would give it.
func (in *allocatorInput) candidateNodes(only string) []*v1.Node {
	if only != "" {
		if node, ok := in.nodes[only]; ok {
			return []*v1.Node{node}
		}
		return []*v1.Node{newNode(only)}
	}
	names := sets.New[string]()
	for name := range in.nodes {
		names.Insert(name)
	}
	for _, slice := range in.slices {
		if name := ptr.Deref(slice.Spec.NodeName, ""); name != "" {
			names.Insert(name)
		}
		for _, device := range slice.Spec.Devices {
			if name := ptr.Deref(device.NodeName, ""); name != "" {
				names.Insert(name)
			}
		}
	}
	if names.Len() == 0 {
		return []*v1.Node{newNode("")}
	}
	nodes := make([]*v1.Node, 0, names.Len())
	for _, name := range sets.List(names) {
		if node, ok := in.nodes[name]; ok {
			nodes = append(nodes, node)
		} else {
			nodes = append(nodes, newNode(name))
		}
	}
	return nodes
}

// addAllocated records the devices of an allocated claim the way the
// scheduler's claim tracker does (foreachAllocatedDevice in
// pkg/scheduler/framework/plugins/dynamicresources/allocateddevices.go):
// adminAccess results do not count; with consumable capacity, shared
// results count by share ID and consumed capacity.
func addAllocated(state *structured.AllocatedState, claim *resourceapi.ResourceClaim, consumableCapacity bool) {
	if claim.Status.Allocation == nil {
		return
	}
	for _, result := range claim.Status.Allocation.Devices.Results {
		if ptr.Deref(result.AdminAccess, false) {
			continue
		}
		deviceID := structured.MakeDeviceID(result.Driver, result.Pool, result.Device)
		if consumableCapacity && result.ShareID != nil {
			state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(deviceID, result.ShareID))
			if result.ConsumedCapacity != nil {
				state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(deviceID, result.ConsumedCapacity))
			}
			continue
		}
		state.AllocatedDevices.Insert(deviceID)
	}
}

// precheck repeats the scheduler's PreFilter checks of a claim to allocate
// (dynamicresources.go): missing classes and disabled features make the pod
// unschedulable, an empty class name is an error.
func precheck(claim *resourceapi.ResourceClaim, classes classLister, features structured.Features) (status, message string) {
	if claim.DeletionTimestamp != nil {
		return statusUnschedulable, fmt.Sprintf("resourceclaim %s is being deleted", klog.KObj(claim))
	}
	checkClass := func(className, requestName string) (string, string) {
		if className == "" {
			return statusError, fmt.Sprintf("request %s: unsupported request type", requestName)
		}
		if _, err := classes.Get(className); err != nil {
			return statusUnschedulable, fmt.Sprintf("request %s: device class %s does not exist", requestName, className)
		}
		return "", ""
	}
	for _, request := range claim.Spec.Devices.Requests {
		switch {
		case request.Exactly != nil:
			if s, m := checkClass(request.Exactly.DeviceClassName, request.Name); s != "" {
				return s, m
			}
		case len(request.FirstAvailable) > 0:
			if !features.PrioritizedList {
				return statusUnschedulable, fmt.Sprintf("resource claim %s, request %s: has subrequests, but the DRAPrioritizedList feature is disabled", klog.KObj(claim), request.Name)
			}
			for _, sub := range request.FirstAvailable {
				if s, m := checkClass(sub.DeviceClassName, request.Name+"/"+sub.Name); s != "" {
					return s, m
				}
			}
		default:
			return statusUnschedulable, fmt.Sprintf("resource claim %s, request %s: unknown request type", klog.KObj(claim), request.Name)
		}
	}
	return "", ""
}

func allocateAll(ctx context.Context, in *allocatorInput, only string, features structured.Features) allocateOutput {
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, claim := range in.claims {
		addAllocated(&state, claim, features.ConsumableCapacity)
	}
	classes := classLister(in.classes)
	// As kube-scheduler: one CEL cache for everything.
	celCache := cel.NewCache(10, celFeatures(features))
	nodes := in.candidateNodes(only)

	out := allocateOutput{Claims: []claimOutcome{}}
	for _, claim := range in.claims {
		if claim.Status.Allocation != nil {
			continue
		}
		outcome := claimOutcome{Namespace: claim.Namespace, Name: claim.Name}
		if status, msg := precheck(claim, classes, features); status != "" {
			outcome.Status = status
			if status == statusError {
				outcome.Error = ptr.To(msg)
			} else {
				outcome.Explanation = ptr.To(msg)
			}
			out.Claims = append(out.Claims, outcome)
			continue
		}

		allocator, err := structured.NewAllocator(ctx, features, state, classes, in.slices, celCache)
		if err != nil {
			outcome.Status = statusError
			outcome.Error = ptr.To(err.Error())
			out.Claims = append(out.Claims, outcome)
			continue
		}
		var reasons []string
		for _, node := range nodes {
			results, err := allocator.Allocate(ctx, node, []*resourceapi.ResourceClaim{claim})
			switch {
			case errors.Is(err, errFailedAllocationOnNode):
				reasons = append(reasons, fmt.Sprintf("%s: %v", nodeLabel(node), err))
				continue
			case err != nil:
				// Fatal for the claim (e.g. a CEL runtime error): the
				// scheduler aborts instead of trying other nodes.
				outcome.Status = statusError
				outcome.Error = ptr.To(err.Error())
			case len(results) != 1:
				reasons = append(reasons, fmt.Sprintf("%s: cannot allocate all claims", nodeLabel(node)))
				continue
			default:
				allocation := results[0]
				claim.Status.Allocation = &allocation
				addAllocated(&state, claim, features.ConsumableCapacity)
				outcome.Status = statusAllocated
				if node.Name != "" {
					outcome.Node = ptr.To(node.Name)
				}
				outcome.Allocation = &allocation
			}
			break
		}
		if outcome.Status == "" {
			outcome.Status = statusUnschedulable
			outcome.Explanation = ptr.To(fmt.Sprintf("0/%d nodes are available: %s", len(nodes), strings.Join(reasons, "; ")))
		}
		out.Claims = append(out.Claims, outcome)
	}
	return out
}

func nodeLabel(node *v1.Node) string {
	if node.Name == "" {
		return "node (unnamed)"
	}
	return "node " + node.Name
}

func printText(w io.Writer, out allocateOutput) error {
	bw := bufio.NewWriter(w)
	for _, c := range out.Claims {
		switch c.Status {
		case statusAllocated:
			where := ""
			if c.Node != nil {
				where = " on " + *c.Node
			}
			fmt.Fprintf(bw, "%s/%s: allocated%s\n", c.Namespace, c.Name, where)
			for _, r := range c.Allocation.Devices.Results {
				extra := ""
				if ptr.Deref(r.AdminAccess, false) {
					extra += " (adminAccess)"
				}
				if r.ShareID != nil {
					extra += fmt.Sprintf(" (share %s)", *r.ShareID)
				}
				fmt.Fprintf(bw, "  %s: %s/%s/%s%s\n", r.Request, r.Driver, r.Pool, r.Device, extra)
			}
		case statusUnschedulable:
			fmt.Fprintf(bw, "%s/%s: unschedulable: %s\n", c.Namespace, c.Name, ptr.Deref(c.Explanation, ""))
		default:
			fmt.Fprintf(bw, "%s/%s: error: %s\n", c.Namespace, c.Name, ptr.Deref(c.Error, ""))
		}
	}
	return bw.Flush()
}
