package kube

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	k8sdiscovery "k8s.io/client-go/discovery"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/internal/background"
	"github.com/kvroute/kvroute/internal/background/backgroundtest"
	"github.com/kvroute/kvroute/router"
)

// panicFleet panics at its first Apply once armed, in the middle of applying a set.
type panicFleet struct {
	armed, fired bool
	applied      [][]router.Worker
}

func (f *panicFleet) Apply(workers []router.Worker) (fleet.Diff, error) {
	if f.armed && !f.fired {
		f.fired = true
		panic("injected fault")
	}
	f.applied = append(f.applied, workers)
	return fleet.Diff{Workers: len(workers)}, nil
}

// panicObjectives panics at its first SetCluster, then keeps the sets it is given.
type panicObjectives struct {
	mu    sync.Mutex
	fired atomic.Bool
	sets  []map[string]int
}

func (o *panicObjectives) SetCluster(objectives map[string]int) {
	if o.fired.CompareAndSwap(false, true) {
		panic("injected fault")
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.sets = append(o.sets, objectives)
}

// newPanicSource is a source of pool "qwen" over fake clients, counting its panics in
// reg.
func newPanicSource(t *testing.T, reg prometheus.Registerer, objectives ObjectiveSink, objects ...runtime.Object) *Source {
	t.Helper()
	src, err := New(discovery.KubernetesConfig{Pool: "qwen"}, Deps{Clients: &Clients{Core: fake.NewClientset(),
		Dynamic: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), gieListKinds(), objects...), Namespace: ns},
		Objectives: objectives, Panics: background.NewMetrics(reg)})
	require.NoError(t, err)
	return src
}

// TestASyncThatPanicsIsRejected: a panic while the pool's worker set is read and
// applied is recovered and counted, and the set is rejected: the workers in force
// stay, the runner's lock is free, and the next sync applies the set.
func TestASyncThatPanicsIsRejected(t *testing.T) {
	reg := prometheus.NewRegistry()
	src := newPanicSource(t, reg, nil)
	pods := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	require.NoError(t, pods.Add(pod("p0", "10.0.0.1")))
	pools := cache.NewStore(cache.MetaNamespaceKeyFunc)
	require.NoError(t, pools.Add(&unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "qwen", "namespace": ns},
		"spec": map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": "vllm"}},
			"targetPorts":       []any{map[string]any{"number": int64(8000)}},
			"endpointPickerRef": map[string]any{"name": "kvroute", "port": map[string]any{"number": int64(9002)}}},
	}}))
	fl := &panicFleet{}
	runner, err := discovery.NewRunner(discovery.SourceKubernetes, src, discovery.RunnerDeps{Fleet: fl, Metrics: discovery.NewMetrics(reg)})
	require.NoError(t, err)
	require.NoError(t, pods.Add(pod("p1", "10.0.0.2")))
	fl.armed = true

	src.sync(runner, listerscorev1.NewPodLister(pods), pools)
	assert.Equal(t, 1.0, backgroundtest.Panics(t, reg, background.LoopDiscovery))
	assert.False(t, runner.Synced(), "the set is rejected: none is in force yet")
	assert.Empty(t, fl.applied)

	src.sync(runner, listerscorev1.NewPodLister(pods), pools)
	assert.True(t, runner.Ready(), "the next sync applies the set")
	assert.Len(t, runner.Workers(), 2)
	assert.Equal(t, 1.0, backgroundtest.Panics(t, reg, background.LoopDiscovery), "one panic, counted once")
}

// TestAnObjectivesPublishThatPanicsIsPublishedAgain: a panic while the pool's
// InferenceObjectives are handed on is recovered and counted, and the set the sink
// missed is published at the next change of the informer, although it is the same.
func TestAnObjectivesPublishThatPanicsIsPublishedAgain(t *testing.T) {
	reg := prometheus.NewRegistry()
	sink := &panicObjectives{}
	src := newPanicSource(t, reg, sink, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": legacy.String(), "kind": "InferenceObjective",
		"metadata": map[string]any{"name": "chat", "namespace": ns},
		"spec":     map[string]any{"poolRef": map[string]any{"name": "qwen"}, "priority": int64(2)},
	}})
	k := src.newCRDWatch().objectives
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, k.watch(ctx, legacy))
	defer k.stopInformer()
	<-k.synced // listed whole

	k.changed()
	assert.Equal(t, 1.0, backgroundtest.Panics(t, reg, background.LoopDiscovery))
	k.changed()
	sink.mu.Lock()
	defer sink.mu.Unlock()
	assert.Equal(t, []map[string]int{{"chat": 2}}, sink.sets)
}

// panicDiscovery panics at its first read of a group version, then answers as d.
type panicDiscovery struct {
	*fakeDiscovery
	fired atomic.Bool
}

func (p *panicDiscovery) ServerResourcesForGroupVersionWithContext(ctx context.Context, groupVersion string) (*metav1.APIResourceList, error) {
	if p.fired.CompareAndSwap(false, true) {
		panic("injected fault")
	}
	return p.fakeDiscovery.ServerResourcesForGroupVersionWithContext(ctx, groupVersion)
}

type withPanicDiscovery struct {
	*fake.Clientset
	d *panicDiscovery
}

func (w withPanicDiscovery) Discovery() k8sdiscovery.DiscoveryInterfaces { return w.d }

// TestACheckOfTheServedKindsThatPanicsFails: a panic while the API server's discovery
// is read is recovered and counted, and the check failed for every group version
// (which changes nothing watched); the next check reads it.
func TestACheckOfTheServedKindsThatPanicsFails(t *testing.T) {
	core := fake.NewClientset()
	d := &panicDiscovery{fakeDiscovery: newFakeDiscovery(core)}
	d.serve(legacy, ObjectivesResource)
	reg := prometheus.NewRegistry()
	src, err := New(discovery.KubernetesConfig{Pool: "qwen"}, Deps{Clients: &Clients{Core: withPanicDiscovery{Clientset: core, d: d},
		Dynamic: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), gieListKinds()), Namespace: ns},
		Panics: background.NewMetrics(reg)})
	require.NoError(t, err)

	reads := src.checkGroupVersions(context.Background())
	assert.Equal(t, 1.0, backgroundtest.Panics(t, reg, background.LoopDiscovery))
	for _, gv := range GroupVersions() {
		assert.ErrorIs(t, reads[gv].err, background.ErrPanicked, "%s", gv)
	}
	reads = src.checkGroupVersions(context.Background())
	assert.Equal(t, []string{ObjectivesResource}, reads[legacy].resources)
	assert.NoError(t, reads[llmd].err)
}
