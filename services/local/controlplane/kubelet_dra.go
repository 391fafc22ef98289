package main

// kubelet-dra: the DRA part of a kubelet for one node, made of the kubelet's
// own code (k8s.io/kubernetes/pkg/kubelet/cm/dra and
// k8s.io/kubernetes/pkg/kubelet/pluginmanager). What the kubelet would do
// with containers is reduced to reporting: once a pod's claims are prepared,
// the CDI device ids of each container go into the pod annotation
// gpudra.dev/cdi-devices and the pod is reported Running.
//
//	kubelet-dra --node NODE --kubeconfig FILE --root DIR [--feature-gates ...] [-v N]
//
// Wiring, as in pkg/kubelet/kubelet.go and pkg/kubelet/cm/container_manager_linux.go:
//   - dra.NewManager(logger, client, root) keeps its checkpoint in
//     <root>/dra_manager_state;
//   - manager.Start(ctx, activePods, getNode, sourcesReady) starts the DRA
//     plugin manager, which wipes the node's ResourceSlices at start-up and
//     30 s after a driver's last plugin disconnects, and the reconcile loop;
//   - pluginmanager.NewPluginManager(<root>/plugins_registry, recorder) with
//     the DRA manager's watcher handler for the DRAPlugin type registers
//     plugins through the real registration handler;
//   - PrepareResources before a pod starts (failures become the kubelet's
//     FailedPrepareDynamicResources event, then a retry with backoff),
//     GetResources per container, UnprepareResources once the pod is being
//     deleted, after which the pod is deleted with grace period 0.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/config"
	kubeletevents "k8s.io/kubernetes/pkg/kubelet/events"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	"k8s.io/utils/ptr"
)

const (
	// CDIDevicesAnnotation holds {"<container name>": ["<CDI device id>", ...]}
	// for every init and regular container of a pod that kubelet-dra started.
	CDIDevicesAnnotation = "gpudra.dev/cdi-devices"
	// ResourcesPreparedCondition is a pod condition set by kubelet-dra:
	// True once PrepareResources succeeded, False (reason
	// FailedPrepareDynamicResources, message = the error) while it fails.
	ResourcesPreparedCondition v1.PodConditionType = "gpudra.dev/ResourcesPrepared"
	// reasonFailedUnprepare is used for events when UnprepareResources fails
	// (the kubelet only logs that case).
	reasonFailedUnprepare = "FailedUnprepareDynamicResources"
)

type kubeletDRA struct {
	node       string
	client     kubernetes.Interface
	manager    *dra.Manager
	podLister  corelisters.PodLister
	nodeLister corelisters.NodeLister
	recorder   record.EventRecorder
	queue      workqueue.TypedRateLimitingInterface[types.UID]

	mu sync.Mutex
	// lastSeen is the newest version of every pod this process knows about,
	// kept after the pod is gone until its resources are unprepared.
	lastSeen map[types.UID]*v1.Pod
	gone     sets.Set[types.UID]
	// running are the pods that were prepared and reported Running.
	running sets.Set[types.UID]
	// unprepared are the pods whose resources were unprepared. The manager
	// drops one pod reference per call and unprepares a shared claim when a
	// call finds only one left, so it must see each pod exactly once, as the
	// kubelet's pod workers guarantee.
	unprepared sets.Set[types.UID]
}

func runKubeletDRA() int {
	fs := pflag.NewFlagSet("kubelet-dra", pflag.ContinueOnError)
	node := fs.String("node", "", "name of the Node object this process acts for (required)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file for the API server (required)")
	root := fs.String("root", "", "kubelet root directory: plugins_registry/, plugins/ and the DRA checkpoint live here (required)")
	retryBase := fs.Duration("retry-base-delay", 500*time.Millisecond, "first delay before a failed pod sync is retried; doubles per failure")
	retryMax := fs.Duration("retry-max-delay", 10*time.Second, "longest delay between retries of a failed pod sync (the kubelet's pod worker backs off 10 s)")
	workers := fs.Int("pod-workers", 8, "pods synced side by side (the kubelet runs a worker per pod: a pod whose prepare waits does not hold up the others)")
	utilfeature.DefaultMutableFeatureGate.AddFlag(fs)
	goflags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(goflags)
	fs.AddGoFlagSet(goflags)
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "kubelet-dra:", err)
		return 2
	}
	if *workers < 1 {
		fmt.Fprintln(os.Stderr, "kubelet-dra: --pod-workers must be at least 1")
		return 2
	}
	if *node == "" || *kubeconfig == "" || *root == "" {
		fmt.Fprintln(os.Stderr, "kubelet-dra: --node, --kubeconfig and --root are required")
		fs.PrintDefaults()
		return 2
	}
	defer klog.Flush()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	logger := klog.LoggerWithValues(klog.Background(), "node", *node)
	ctx = klog.NewContext(ctx, logger)

	if err := runKubeletDRAWith(ctx, *node, *kubeconfig, *root, *retryBase, *retryMax, *workers); err != nil {
		logger.Error(err, "kubelet-dra failed")
		return 1
	}
	return 0
}

func runKubeletDRAWith(ctx context.Context, node, kubeconfig, root string, retryBase, retryMax time.Duration, workers int) error {
	logger := klog.FromContext(ctx)
	root, err := filepath.Abs(root)
	if err != nil {
		return err
	}
	registrationDir := filepath.Join(root, "plugins_registry")
	for _, dir := range []string{root, registrationDir, filepath.Join(root, "plugins")} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}

	restConfig, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	restConfig.UserAgent = "kubelet-dra/" + node
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return err
	}

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	broadcaster.StartStructuredLogging(3)
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "kubelet", Host: node})

	podFactory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
		}))
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", node).String()
		}))
	podInformer := podFactory.Core().V1().Pods()
	nodeInformer := nodeFactory.Core().V1().Nodes()

	k := &kubeletDRA{
		node:       node,
		client:     client,
		podLister:  podInformer.Lister(),
		nodeLister: nodeInformer.Lister(),
		recorder:   recorder,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](retryBase, retryMax),
			workqueue.TypedRateLimitingQueueConfig[types.UID]{Name: "kubelet-dra"}),
		lastSeen:   map[types.UID]*v1.Pod{},
		gone:       sets.New[types.UID](),
		running:    sets.New[types.UID](),
		unprepared: sets.New[types.UID](),
	}
	defer k.queue.ShutDown()

	if _, err := podInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { k.observe(obj, false) },
		UpdateFunc: func(_, obj any) { k.observe(obj, false) },
		DeleteFunc: func(obj any) { k.observe(obj, true) },
	}); err != nil {
		return err
	}
	podFactory.Start(ctx.Done())
	nodeFactory.Start(ctx.Done())
	defer podFactory.Shutdown()
	defer nodeFactory.Shutdown()

	// As in the kubelet: all sources are ready once the API server source
	// (here: the pod informer) has synced.
	sourcesReady := kubeletconfig.NewSourcesReady(func(sets.Set[string]) bool {
		return podInformer.Informer().HasSynced()
	})
	getNode := nodeGetter(func() (*v1.Node, error) { return k.nodeLister.Get(node) })

	manager, err := dra.NewManager(logger, client, root)
	if err != nil {
		return fmt.Errorf("create DRA manager: %w", err)
	}
	k.manager = manager
	if err := manager.Start(ctx, k.activePods, getNode, sourcesReady); err != nil {
		return fmt.Errorf("start DRA manager: %w", err)
	}
	// Resource health updates (DRAResourceHealth) would refresh pod status in
	// the kubelet; here they are only logged, but the channel must be drained.
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case update, ok := <-manager.Updates():
				if !ok {
					return
				}
				logger.V(2).Info("DRA resource health update", "podUIDs", update.PodUIDs)
				for _, uid := range update.PodUIDs {
					k.queue.Add(types.UID(uid))
				}
			}
		}
	}()

	pluginManager := pluginmanager.NewPluginManager(registrationDir, recorder)
	pluginManager.AddHandler(pluginwatcherapi.DRAPlugin, manager.GetWatcherHandler())
	go runPluginManager(ctx, pluginManager, sourcesReady)

	if !cache.WaitForNamedCacheSyncWithContext(ctx, podInformer.Informer().HasSynced, nodeInformer.Informer().HasSynced) {
		return ctx.Err()
	}
	logger.Info("kubelet-dra running", "root", root, "pluginsRegistry", registrationDir)

	// The work queue hands one pod to one worker at a time, as the kubelet's pod
	// workers sync each pod serially and different pods side by side.
	for i := 0; i < workers; i++ {
		go wait.UntilWithContext(ctx, k.worker, time.Second)
	}
	<-ctx.Done()
	logger.Info("kubelet-dra shutting down")
	return nil
}

func (k *kubeletDRA) observe(obj any, deleted bool) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	k.mu.Lock()
	k.lastSeen[pod.UID] = pod
	if deleted {
		k.gone.Insert(pod.UID)
	}
	k.mu.Unlock()
	k.queue.Add(pod.UID)
}

// activePods is the dra.ActivePodsFunc: pods bound to the node that are
// neither terminal nor being deleted (the kubelet's GetActivePods filters
// out pods that are terminated or whose termination was requested).
func (k *kubeletDRA) activePods() []*v1.Pod {
	pods, err := k.podLister.List(labels.Everything())
	if err != nil {
		return nil
	}
	active := make([]*v1.Pod, 0, len(pods))
	for _, pod := range pods {
		if pod.DeletionTimestamp != nil || isTerminal(pod) {
			continue
		}
		active = append(active, pod)
	}
	return active
}

func (k *kubeletDRA) worker(ctx context.Context) {
	for {
		uid, shutdown := k.queue.Get()
		if shutdown {
			return
		}
		err := k.sync(ctx, uid)
		if err != nil {
			klog.FromContext(ctx).Info("Pod sync failed, will retry", "podUID", uid, "err", err)
			k.queue.AddRateLimited(uid)
		} else {
			k.queue.Forget(uid)
		}
		k.queue.Done(uid)
	}
}

func (k *kubeletDRA) sync(ctx context.Context, uid types.UID) error {
	logger := klog.FromContext(ctx)
	k.mu.Lock()
	last := k.lastSeen[uid]
	isGone := k.gone.Has(uid)
	k.mu.Unlock()
	if last == nil {
		return nil
	}
	pod := last
	if !isGone {
		current, err := k.podLister.Pods(last.Namespace).Get(last.Name)
		switch {
		case apierrors.IsNotFound(err) || (err == nil && current.UID != uid):
			isGone = true
		case err != nil:
			return err
		default:
			pod = current
		}
	}
	logger = klog.LoggerWithValues(logger, "pod", klog.KObj(pod), "podUID", uid)

	if isGone {
		// Removed from the API server without passing through us (force
		// deletion): unprepare from the last copy we saw.
		if err := k.unprepareOnce(ctx, pod); err != nil {
			return err
		}
		k.forget(uid)
		logger.V(2).Info("Pod gone, resources unprepared")
		return nil
	}

	if pod.DeletionTimestamp != nil || isTerminal(pod) {
		// kubelet: resources are unprepared after all containers stopped and
		// before the final status goes to the API server.
		if err := k.unprepareOnce(ctx, pod); err != nil {
			k.recorder.Eventf(pod, v1.EventTypeWarning, reasonFailedUnprepare, "Failed to unprepare dynamic resources: %v", err)
			return err
		}
		k.mu.Lock()
		k.running.Delete(uid)
		k.mu.Unlock()
		if pod.DeletionTimestamp == nil {
			return nil
		}
		err := k.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0),
			Preconditions:      metav1.NewUIDPreconditions(string(uid)),
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("delete pod: %w", err)
		}
		logger.V(2).Info("Pod resources unprepared, pod deleted")
		return nil
	}

	k.mu.Lock()
	isRunning := k.running.Has(uid)
	k.mu.Unlock()
	if isRunning {
		return nil
	}

	if err := k.manager.PrepareResources(ctx, pod); err != nil {
		// Same event as kuberuntime_manager.go SyncPod.
		k.recorder.Eventf(pod, v1.EventTypeWarning, kubeletevents.FailedPrepareDynamicResources, "Failed to prepare dynamic resources: %v", err)
		logger.Error(err, "Failed to prepare dynamic resources")
		if serr := k.setPrepareFailed(ctx, pod, err); serr != nil {
			logger.Error(serr, "Failed to record prepare failure in pod status")
		}
		return err
	}

	devices := map[string][]string{}
	containers := make([]v1.Container, 0, len(pod.Spec.InitContainers)+len(pod.Spec.Containers))
	containers = append(containers, pod.Spec.InitContainers...)
	containers = append(containers, pod.Spec.Containers...)
	for i := range containers {
		info, err := k.manager.GetResources(pod, &containers[i])
		if err != nil {
			k.recorder.Eventf(pod, v1.EventTypeWarning, kubeletevents.FailedPrepareDynamicResources, "Failed to get dynamic resources of container %s: %v", containers[i].Name, err)
			return err
		}
		// Two pods of one claim synced side by side may both have called
		// NodePrepareResources (the manager checks "prepared" before the call and
		// records the devices after it), and the manager then lists the claim's
		// devices twice; a container gets each CDI device once.
		ids := make([]string, 0, len(info.CDIDevices))
		seen := sets.New[string]()
		for _, d := range info.CDIDevices {
			if !seen.Has(d.Name) {
				seen.Insert(d.Name)
				ids = append(ids, d.Name)
			}
		}
		devices[containers[i].Name] = ids
	}
	if err := k.setRunning(ctx, pod, devices); err != nil {
		return err
	}
	k.mu.Lock()
	k.running.Insert(uid)
	k.mu.Unlock()
	logger.Info("Pod resources prepared, pod reported Running", "cdiDevices", devices)
	return nil
}

func (k *kubeletDRA) forget(uid types.UID) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.lastSeen, uid)
	k.gone.Delete(uid)
	k.running.Delete(uid)
	// k.unprepared keeps the UID: a late informer event can bring the pod back
	// into lastSeen, and a second UnprepareResources for it would release a
	// shared claim that another pod still uses (the manager unprepares when at
	// most one pod reference is left, whichever pod it is). The kubelet's pod
	// workers unprepare a pod once; UIDs are never reused.
}

// unprepareOnce calls the manager's UnprepareResources for a pod at most once
// (successfully); later syncs of the same pod skip it.
func (k *kubeletDRA) unprepareOnce(ctx context.Context, pod *v1.Pod) error {
	k.mu.Lock()
	done := k.unprepared.Has(pod.UID)
	k.mu.Unlock()
	if done {
		return nil
	}
	if err := k.manager.UnprepareResources(ctx, pod); err != nil {
		return err
	}
	k.mu.Lock()
	k.unprepared.Insert(pod.UID)
	k.mu.Unlock()
	return nil
}

// setRunning records the CDI devices in the pod annotation, then reports the
// pod Running the way the kubelet's status manager would.
func (k *kubeletDRA) setRunning(ctx context.Context, pod *v1.Pod, devices map[string][]string) error {
	value, err := json.Marshal(devices)
	if err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{
			"uid":         pod.UID, // makes the patch fail for a replaced pod
			"annotations": map[string]string{CDIDevicesAnnotation: string(value)},
		},
	})
	if err != nil {
		return err
	}
	if _, err := k.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("annotate pod: %w", err)
	}

	return k.updateStatus(ctx, pod, func(p *v1.Pod) {
		now := metav1.Now()
		p.Status.Phase = v1.PodRunning
		p.Status.HostIP = "127.0.0.1"
		p.Status.HostIPs = []v1.HostIP{{IP: "127.0.0.1"}}
		if p.Status.StartTime == nil {
			p.Status.StartTime = &now
		}
		for _, t := range []v1.PodConditionType{v1.PodReadyToStartContainers, v1.PodInitialized, v1.ContainersReady, v1.PodReady} {
			setCondition(&p.Status, v1.PodCondition{Type: t, Status: v1.ConditionTrue})
		}
		setCondition(&p.Status, v1.PodCondition{Type: ResourcesPreparedCondition, Status: v1.ConditionTrue, Reason: "ResourcesPrepared"})
		p.Status.InitContainerStatuses = nil
		for _, c := range p.Spec.InitContainers {
			p.Status.InitContainerStatuses = append(p.Status.InitContainerStatuses, v1.ContainerStatus{
				Name: c.Name, Image: c.Image, Ready: true, Started: ptr.To(false),
				State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{
					ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now,
					ContainerID: "kubelet-dra://" + string(p.UID) + "/" + c.Name,
				}},
				ContainerID: "kubelet-dra://" + string(p.UID) + "/" + c.Name,
			})
		}
		p.Status.ContainerStatuses = nil
		for _, c := range p.Spec.Containers {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, v1.ContainerStatus{
				Name: c.Name, Image: c.Image, Ready: true, Started: ptr.To(true),
				State:       v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}},
				ContainerID: "kubelet-dra://" + string(p.UID) + "/" + c.Name,
			})
		}
	})
}

func (k *kubeletDRA) setPrepareFailed(ctx context.Context, pod *v1.Pod, prepareErr error) error {
	return k.updateStatus(ctx, pod, func(p *v1.Pod) {
		setCondition(&p.Status, v1.PodCondition{
			Type:    ResourcesPreparedCondition,
			Status:  v1.ConditionFalse,
			Reason:  kubeletevents.FailedPrepareDynamicResources,
			Message: prepareErr.Error(),
		})
	})
}

func (k *kubeletDRA) updateStatus(ctx context.Context, pod *v1.Pod, mutate func(*v1.Pod)) error {
	pods := k.client.CoreV1().Pods(pod.Namespace)
	first := true
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current := pod.DeepCopy()
		if !first {
			fresh, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if fresh.UID != pod.UID {
				return apierrors.NewNotFound(v1.Resource("pods"), pod.Name)
			}
			current = fresh
		}
		first = false
		before := current.Status.DeepCopy()
		mutate(current)
		if statusEqual(before, &current.Status) {
			return nil
		}
		_, err := pods.UpdateStatus(ctx, current, metav1.UpdateOptions{})
		return err
	})
}

// setCondition sets or replaces a condition, keeping LastTransitionTime when
// the status does not change.
func setCondition(status *v1.PodStatus, cond v1.PodCondition) {
	now := metav1.Now()
	for i := range status.Conditions {
		existing := &status.Conditions[i]
		if existing.Type != cond.Type {
			continue
		}
		if existing.Status == cond.Status {
			cond.LastTransitionTime = existing.LastTransitionTime
			cond.LastProbeTime = existing.LastProbeTime
		} else {
			cond.LastTransitionTime = now
		}
		*existing = cond
		return
	}
	cond.LastTransitionTime = now
	status.Conditions = append(status.Conditions, cond)
}

func statusEqual(a, b *v1.PodStatus) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && string(ja) == string(jb)
}

func isTerminal(pod *v1.Pod) bool {
	return pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed
}
