package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/internal/background"
	"github.com/kvroute/kvroute/rewrite"
	"github.com/kvroute/kvroute/router"
)

// Clients are the API clients a Source reads through.
type Clients struct {
	Core    kubernetes.Interface
	Dynamic dynamic.Interface
	// Namespace is used when the config names none: the service account's in a
	// cluster, the kubeconfig context's outside one.
	Namespace string
}

// Deps are a Source's collaborators; all are optional.
type Deps struct {
	// Clients, when nil, are built from the config: its kubeconfig, or the in-cluster
	// service account.
	Clients *Clients
	// Resync is the informers' resync period; 0 means DefaultResync.
	Resync time.Duration
	// LoRAAdapters are the config's lora_adapters: a pod whose models annotation names
	// one is left out (the fleet would refuse the whole set).
	LoRAAdapters []router.LoRAAdapter
	// Objectives, when set, hears the priorities of the pool's InferenceObjectives
	// (while the API server serves them, in either group; an empty set when their CRD
	// goes): each set, as they are added, changed and deleted.
	Objectives ObjectiveSink
	// Rewrites, when set, hears the pool's InferenceModelRewrites (while the API server
	// serves them, in either group; an empty set when their CRD goes): each set, oldest
	// first, as they are added, changed and deleted.
	Rewrites RewriteSink
	// CRDCheck is how often the API server's discovery is read to learn where it serves
	// InferenceObjectives and InferenceModelRewrites (GroupVersions: their CRDs
	// installed, removed or moved since); 0 means DefaultCRDCheck.
	CRDCheck time.Duration
	// Panics counts the syncs whose reading panicked (loop "discovery"); nil counts
	// nothing.
	Panics *background.Metrics
	Logger *slog.Logger
}

// DefaultResync is how often the informers replay their caches. A replay changes
// nothing unless an event was missed: the runner skips an unchanged set.
const DefaultResync = 10 * time.Minute

// Source is the pods of one InferencePool, as workers.
type Source struct {
	cfg       discovery.KubernetesConfig
	namespace string
	clients   Clients
	resync    time.Duration
	crdCheck  time.Duration
	adapters  []router.LoRAAdapter
	log       *slog.Logger
	guard     background.Guard // each sync's, each check of the API server's kinds
	// objectiveSink hears the pool's objectives; nil: they are not watched.
	objectiveSink ObjectiveSink

	// What was last logged, so that each pod status update does not log again.
	lastSkipped []string
	lastState   string
	// The objectives last published and the problems last logged.
	lastObjectives        map[string]int
	lastObjectiveProblems []string
	// rewriteSink hears the pool's model rewrites; nil: they are not watched. The
	// rewrites last published and the problems last logged.
	rewriteSink         RewriteSink
	lastRewrites        []rewrite.Rewrite
	lastRewriteProblems []string
}

var _ discovery.Source = (*Source)(nil)

// New returns the source of cfg's pool. Without Deps.Clients it builds clients from
// the kubeconfig or the in-cluster service account; an error there names the key.
func New(cfg discovery.KubernetesConfig, deps Deps) (*Source, error) {
	if err := (discovery.Config{Source: discovery.SourceKubernetes, Kubernetes: cfg}).Validate(); err != nil {
		return nil, err
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if deps.Resync <= 0 {
		deps.Resync = DefaultResync
	}
	if deps.CRDCheck <= 0 {
		deps.CRDCheck = DefaultCRDCheck
	}
	clients := deps.Clients
	if clients == nil {
		var err error
		if clients, err = NewClients(cfg.Kubeconfig); err != nil {
			return nil, err
		}
	}
	if clients.Core == nil || clients.Dynamic == nil {
		return nil, errors.New("discovery.kubernetes: core and dynamic clients are required")
	}
	namespace := cfg.Namespace
	if namespace == "" {
		namespace = clients.Namespace
	}
	if namespace == "" {
		return nil, errors.New("discovery.kubernetes.namespace: not set, and neither the service account nor the kubeconfig names one")
	}
	return &Source{cfg: cfg, namespace: namespace, clients: *clients, resync: deps.Resync, crdCheck: deps.CRDCheck,
		adapters: slices.Clone(deps.LoRAAdapters), log: deps.Logger, guard: background.NewGuard(background.LoopDiscovery, deps.Logger, deps.Panics), objectiveSink: deps.Objectives, rewriteSink: deps.Rewrites}, nil
}

// watch makes every change informer sees poke dirty, without blocking (a recompute
// already due sees it too), and logs why a list or watch of what (a resource, with its
// group: "inferencepools.inference.networking.k8s.io") fails: a missing grant, named,
// or a missing CRD; the informer keeps retrying with back-off.
func (s *Source) watch(what string, informer cache.SharedIndexInformer, dirty chan<- struct{}) error {
	poke := func() {
		select {
		case dirty <- struct{}{}:
		default:
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(any, any) { poke() },
		DeleteFunc: func(any) { poke() },
	}); err != nil {
		return fmt.Errorf("discovery: watch %s: %w", what, err)
	}
	_ = informer.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		if apierrors.IsForbidden(err) {
			// The usual cause after an upgrade: a Role that predates a group kvroute now
			// reads (llm-d.ai's CRDs installed beside the legacy ones).
			s.log.Error("kubernetes discovery: list/watch forbidden; retrying: grant get, list and watch on "+what+" to kvroute's service account (examples/kubernetes/30-kvroute.yaml)",
				"namespace", s.namespace, "error", err)
			return
		}
		s.log.Warn("kubernetes discovery: list/watch failed; retrying", "resource", what, "namespace", s.namespace, "error", err)
	})
	return nil
}

// Namespace is the namespace the source reads.
func (s *Source) Namespace() string { return s.namespace }

// Run watches the pool and its namespace's pods until ctx is done. The first set is
// reported once both caches have synced; a missing pool, or one marked for deletion,
// reports no workers, an invalid one is rejected (the workers in force stay). With
// Deps.Objectives and Deps.Rewrites it also watches the namespace's InferenceObjectives
// and InferenceModelRewrites while the API server serves them, each in the group it
// serves it in (discovery read again every Deps.CRDCheck), apart: the workers wait for
// none of them (an objective not yet read has priority 0, so nothing is shed for it; a
// rewrite not yet read rewrites nothing).
func (s *Source) Run(ctx context.Context, sink discovery.Sink) error {
	dirty := make(chan struct{}, 1)

	podFactory := informers.NewSharedInformerFactoryWithOptions(s.clients.Core, s.resync,
		informers.WithNamespace(s.namespace), informers.WithTransform(s.trimPod))
	podInformer := podFactory.Core().V1().Pods().Informer()
	podLister := podFactory.Core().V1().Pods().Lister()
	poolFactory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(s.clients.Dynamic, s.resync, s.namespace,
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", s.cfg.Pool).String()
		})
	poolInformer := poolFactory.ForResource(PoolResource()).Informer()
	for what, informer := range map[string]cache.SharedIndexInformer{"pods": podInformer, PoolResource().GroupResource().String(): poolInformer} {
		if err := s.watch(what, informer, dirty); err != nil {
			return err
		}
	}

	crds := s.newCRDWatch()

	ctx, cancel := context.WithCancel(ctx)
	defer podFactory.Shutdown() // after cancel: Shutdown waits for the informers to stop
	defer poolFactory.Shutdown()
	defer crds.stop()
	defer cancel()
	podFactory.Start(ctx.Done())
	poolFactory.Start(ctx.Done())
	crds.start(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), podInformer.HasSynced, poolInformer.HasSynced) {
		return ctx.Err()
	}
	s.sync(sink, podLister, poolInformer.GetStore())
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-dirty:
			s.sync(sink, podLister, poolInformer.GetStore())
		case <-crds.kind(true).changes():
			crds.kind(true).changed()
		case <-crds.kind(false).changes():
			crds.kind(false).changed()
		case found := <-crds.findings():
			if err := crds.follow(ctx, found); err != nil {
				return err
			}
		}
	}
}

// sync publishes the worker set the caches hold now. A sync that panics (a bug the
// cluster's objects reached) is recovered, logged and counted
// (kvroute_background_panics_total{loop="discovery"}), and rejected: the workers in
// force stay, and the next change or informer resync publishes again.
func (s *Source) sync(sink discovery.Sink, pods listerscorev1.PodLister, pools cache.Store) {
	if err := s.guard.Do(func() error { s.publish(sink, pods, pools); return nil }); err != nil {
		sink.Reject(fmt.Errorf("InferencePool %s/%s: %w", s.namespace, s.cfg.Pool, err))
	}
}

// publish reports the worker set the caches hold now.
func (s *Source) publish(sink discovery.Sink, pods listerscorev1.PodLister, pools cache.Store) {
	spec, missing, err := s.pool(pools)
	if err != nil {
		s.lastState = "invalid" // the runner logs the rejection
		sink.Reject(fmt.Errorf("InferencePool %s/%s: %w", s.namespace, s.cfg.Pool, err))
		return
	}
	if missing != "" {
		s.logState(missing, "kubernetes discovery: InferencePool "+missing+": no workers, not ready")
		sink.Missing(fmt.Errorf("InferencePool %s/%s %s", s.namespace, s.cfg.Pool, missing))
		return
	}
	s.logState("found", "kubernetes discovery: InferencePool found",
		"selector", spec.Selector.MatchLabels, "target_ports", spec.TargetPorts)
	all, err := pods.Pods(s.namespace).List(labels.Everything())
	if err != nil { // the cache's lister does not fail; kept for the interface's sake
		sink.Reject(fmt.Errorf("list pods: %w", err))
		return
	}
	workers, skipped := Workers(spec, all, s.cfg, s.adapters)
	if !slices.Equal(skipped, s.lastSkipped) {
		if len(skipped) > 0 {
			s.log.Info("kubernetes discovery: pods of the pool that are not workers", "pods", strings.Join(skipped, "; "))
		}
		s.lastSkipped = skipped
	}
	sink.Update(workers)
}

// logState logs msg when the pool's state changes.
func (s *Source) logState(state, msg string, args ...any) {
	if state == s.lastState {
		return
	}
	s.lastState = state
	level := slog.LevelWarn
	if state == "found" {
		level = slog.LevelInfo
	}
	s.log.Log(context.Background(), level, msg, append([]any{"pool", s.cfg.Pool, "namespace", s.namespace}, args...)...)
}

// Why a pool is missing (publish's missing), as its log and readiness say.
const (
	poolNotFound = "not found"
	poolDeleting = "marked for deletion"
)

// pool reads the pool from the cache; missing says why there is none to read:
// poolNotFound, or poolDeleting for a pool whose deletion has begun (a finalizer or a
// foreground delete holds it), which GIE's pickers also treat as gone. The informer
// lists by name; the filter here also covers clients that ignore field selectors.
func (s *Source) pool(store cache.Store) (spec InferencePoolSpec, missing string, err error) {
	for _, obj := range store.List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok || u.GetName() != s.cfg.Pool || u.GetNamespace() != s.namespace {
			continue
		}
		if u.GetDeletionTimestamp() != nil {
			return InferencePoolSpec{}, poolDeleting, nil
		}
		var pool InferencePool
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), &pool); err != nil {
			return InferencePoolSpec{}, "", fmt.Errorf("decode: %w", err)
		}
		if err := pool.Spec.Validate(); err != nil {
			return InferencePoolSpec{}, "", err
		}
		return pool.Spec, "", nil
	}
	return InferencePoolSpec{}, poolNotFound, nil
}

// trimPod keeps what Workers reads of a pod: the informer's cache then holds a few
// hundred bytes per pod of the namespace, not whole pod specs.
func (s *Source) trimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	trimmed := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
			Labels: pod.Labels, DeletionTimestamp: pod.DeletionTimestamp,
		},
		Status: corev1.PodStatus{Phase: pod.Status.Phase, PodIP: pod.Status.PodIP},
	}
	for _, key := range append([]string{s.cfg.ModelsAnnotation}, ActivePortsAnnotations...) {
		if v, ok := pod.Annotations[key]; ok && key != "" {
			if trimmed.Annotations == nil {
				trimmed.Annotations = map[string]string{}
			}
			trimmed.Annotations[key] = v
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			trimmed.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return trimmed, nil
}
