package kube

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8sdiscovery "k8s.io/client-go/discovery"
	fakediscovery "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/poll"
	"github.com/kvroute/kvroute/priority"
	"github.com/kvroute/kvroute/rewrite"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
)

const ns = "llm"

// cluster is a fake API server behind a real discovery → fleet → index → router chain,
// the objectives table the source fills among the router's dependencies, and the model
// rewrites table it fills.
type cluster struct {
	t          *testing.T
	core       *fake.Clientset
	dyn        *dynamicfake.FakeDynamicClient
	index      *index.Index
	router     *router.Router
	runner     *discovery.Runner
	applies    *countingFleet
	sink       *countingSink
	objectives *priority.Objectives
	rewrites   *rewrite.Table
	// discovery is what the API server's discovery says of the GIE groups now.
	discovery *fakeDiscovery
	log       *lockedBuffer
	// watched is what the fleet last told its watchers (health probes, scrapes and
	// model lists) to poll.
	watched *recordingWatcher
}

// recordingWatcher is a fleet watcher that keeps the last targets it was given.
type recordingWatcher struct {
	mu      sync.Mutex
	targets []poll.Target
}

func (w *recordingWatcher) SetWorkers(targets []poll.Target) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.targets = slices.Clone(targets)
}

func (w *recordingWatcher) last() []poll.Target {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.targets)
}

// crdState is what the fake API server's discovery answers for InferenceObjectives in
// the legacy group.
type crdState string

const (
	crdInstalled crdState = "installed" // served
	crdAbsent    crdState = "absent"    // 404, as for a group no CRD serves
	crdFailing   crdState = "failing"   // 500: discovery itself fails (every group)
)

// legacy and llmd are the group versions InferenceObjectives and InferenceModelRewrites
// are served in.
var (
	llmd   = schema.GroupVersion{Group: Group, Version: Version}
	legacy = schema.GroupVersion{Group: LegacyGroup, Version: Version}
)

// setCRD installs or removes the InferenceObjective CRD of the legacy group, or makes
// discovery fail. Only discovery answers differently: the fake dynamic client serves
// the objects whatever (a real API server deletes them with their CRD).
func (c *cluster) setCRD(state crdState) {
	switch state {
	case crdInstalled:
		c.discovery.serve(legacy, ObjectivesResource)
	case crdAbsent:
		c.discovery.serve(legacy)
	}
	c.discovery.fail(state == crdFailing)
}

// fakeDiscovery is client-go's fake discovery answering for each group version what the
// test serves there now: its resources, a 404 when none (no CRD of the group is
// installed), or a 500 while failing. client-go's own fake cannot change its answer
// while a reader runs (its list is read without a lock), nor answer per group.
type fakeDiscovery struct {
	*fakediscovery.FakeDiscovery
	mu      sync.Mutex
	served  map[schema.GroupVersion][]string
	failing bool
}

func newFakeDiscovery(core *fake.Clientset) *fakeDiscovery {
	return &fakeDiscovery{FakeDiscovery: core.Discovery().(*fakediscovery.FakeDiscovery), served: map[schema.GroupVersion][]string{}}
}

// serve makes gv serve resources (none: a 404).
func (d *fakeDiscovery) serve(gv schema.GroupVersion, resources ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.served[gv] = resources
}

// fail makes every read fail, or not.
func (d *fakeDiscovery) fail(failing bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.failing = failing
}

func (d *fakeDiscovery) ServerResourcesForGroupVersionWithContext(_ context.Context, groupVersion string) (*metav1.APIResourceList, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	gv, err := schema.ParseGroupVersion(groupVersion)
	if err != nil {
		return nil, err
	}
	if d.failing {
		return nil, apierrors.NewInternalError(errors.New("etcd is having a bad day"))
	}
	if len(d.served[gv]) == 0 {
		return nil, apierrors.NewNotFound(schema.GroupResource{Group: gv.Group}, gv.Version)
	}
	list := &metav1.APIResourceList{GroupVersion: groupVersion}
	for _, r := range d.served[gv] {
		list.APIResources = append(list.APIResources, metav1.APIResource{Name: r, Namespaced: true})
	}
	return list, nil
}

// withDiscovery is a fake clientset whose discovery is d.
type withDiscovery struct {
	*fake.Clientset
	d *fakeDiscovery
}

func (w withDiscovery) Discovery() k8sdiscovery.DiscoveryInterfaces { return w.d }

// gieListKinds are the list kinds the fake dynamic client serves: the pool, and both
// kinds in both groups.
func gieListKinds() map[schema.GroupVersionResource]string {
	kinds := map[schema.GroupVersionResource]string{PoolResource(): "InferencePoolList"}
	for _, gv := range GroupVersions() {
		kinds[ObjectiveResource(gv)] = "InferenceObjectiveList"
		kinds[ModelRewriteResource(gv)] = "InferenceModelRewriteList"
	}
	return kinds
}

// lockedBuffer is a log written by the source's goroutines and read by the test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// countingFleet counts the sets the fleet applied.
type countingFleet struct {
	*fleet.Fleet
	mu sync.Mutex
	n  int
}

func (c *countingFleet) Apply(ws []router.Worker) (fleet.Diff, error) {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return c.Fleet.Apply(ws)
}

func (c *countingFleet) count() int { c.mu.Lock(); defer c.mu.Unlock(); return c.n }

// countingSink counts what the source reported, before the runner skips repeats.
type countingSink struct {
	discovery.Sink
	mu               sync.Mutex
	updates, rejects int
}

func (c *countingSink) Update(ws []router.Worker) {
	c.mu.Lock()
	c.updates++
	c.mu.Unlock()
	c.Sink.Update(ws)
}

func (c *countingSink) Reject(err error) {
	c.mu.Lock()
	c.rejects++
	c.mu.Unlock()
	c.Sink.Reject(err)
}

func (c *countingSink) count() int { c.mu.Lock(); defer c.mu.Unlock(); return c.updates }

func (c *countingSink) rejected() int { c.mu.Lock(); defer c.mu.Unlock(); return c.rejects }

// sinkRunner runs a source into a given sink.
type sinkRunner struct {
	src  *Source
	sink discovery.Sink
}

func (s sinkRunner) Run(ctx context.Context, _ discovery.Sink) error { return s.src.Run(ctx, s.sink) }

func newCluster(t *testing.T, cfg discovery.KubernetesConfig, resync time.Duration, adapters ...router.LoRAAdapter) *cluster {
	t.Helper()
	return startCluster(t, cfg, resync, false, adapters...)
}

// startCluster is newCluster whose API server serves InferenceObjectives (their CRD
// installed) when servesObjectives is set.
func startCluster(t *testing.T, cfg discovery.KubernetesConfig, resync time.Duration, servesObjectives bool, adapters ...router.LoRAAdapter) *cluster {
	t.Helper()
	return startClusterWith(t, cfg, resync, servesObjectives, nil, adapters...)
}

// startClusterWith is startCluster with setup run on the fake clients before the source
// starts (a reactor added later races the informers' reads of the reactor chain).
func startClusterWith(t *testing.T, cfg discovery.KubernetesConfig, resync time.Duration, servesObjectives bool, setup func(*cluster), adapters ...router.LoRAAdapter) *cluster {
	t.Helper()
	c := &cluster{t: t, core: fake.NewClientset(), objectives: priority.NewObjectives(nil), log: &lockedBuffer{}, watched: &recordingWatcher{},
		rewrites: rewrite.NewTable(nil, rand.New(rand.NewPCG(3, 4)), nil)}
	c.discovery = newFakeDiscovery(c.core)
	c.setCRD(crdAbsent)
	if servesObjectives {
		c.setCRD(crdInstalled)
	}
	c.dyn = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), gieListKinds())
	if setup != nil {
		setup(c)
	}
	var err error
	c.index, err = index.New(index.DefaultConfig(), nil)
	require.NoError(t, err)
	policy, err := scoring.NewPolicy(scoring.DefaultParams())
	require.NoError(t, err)
	c.router, err = router.New(router.Config{BlockSize: 4, LoRAAdapters: adapters}, router.Deps{
		Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}, Index: c.index, Bookings: scoring.NewBookings(),
		Picker: scoring.Pickers()["kv"].New(policy, rand.New(rand.NewPCG(1, 2))), RecordBlocks: true,
		Objectives: c.objectives, Saturation: priority.DefaultConfig().Saturation(), // no engine load: no worker has capacity
	})
	require.NoError(t, err)
	f, err := fleet.New(nil, fleet.Deps{Index: c.index, Router: c.router, Watchers: []fleet.Watcher{c.watched}})
	require.NoError(t, err)
	c.applies = &countingFleet{Fleet: f}

	cfg.Pool = "qwen"
	// The fake answers discovery at once: checking often costs nothing, and a test
	// that installs the CRD sees it followed within milliseconds.
	src, err := New(cfg, Deps{Clients: &Clients{Core: withDiscovery{Clientset: c.core, d: c.discovery}, Dynamic: c.dyn, Namespace: ns},
		Resync: resync, LoRAAdapters: adapters, Objectives: c.objectives, Rewrites: c.rewrites, CRDCheck: 5 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(c.log, nil))})
	require.NoError(t, err)
	// The runner is the sink; the counting sink sits between the source and it.
	holder := &sinkRunner{src: src}
	c.runner, err = discovery.NewRunner(discovery.SourceKubernetes, holder, discovery.RunnerDeps{Fleet: c.applies})
	require.NoError(t, err)
	c.sink = &countingSink{Sink: c.runner}
	holder.sink = c.sink

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.runner.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

func (c *cluster) pool(selector map[string]string, ports ...int64) {
	c.t.Helper()
	c.poolSpeaking("", selector, ports...)
}

// poolSpeaking is pool with spec.appProtocol set to appProtocol ("": left out).
func (c *cluster) poolSpeaking(appProtocol string, selector map[string]string, ports ...int64) {
	c.t.Helper()
	var targetPorts []any
	for _, p := range ports {
		targetPorts = append(targetPorts, map[string]any{"number": p})
	}
	sel := map[string]any{}
	for k, v := range selector {
		sel[k] = v
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "qwen", "namespace": ns},
		"spec": map[string]any{"selector": map[string]any{"matchLabels": sel}, "targetPorts": targetPorts,
			"endpointPickerRef": map[string]any{"name": "kvroute", "port": map[string]any{"number": int64(9002)}}},
		"status": map[string]any{"parents": []any{}},
	}}
	if appProtocol != "" {
		u.Object["spec"].(map[string]any)["appProtocol"] = appProtocol
	}
	pools := c.dyn.Resource(PoolResource()).Namespace(ns)
	ctx := context.Background()
	if existing, err := pools.Get(ctx, "qwen", metav1.GetOptions{}); err == nil {
		u.SetResourceVersion(existing.GetResourceVersion())
		_, err = pools.Update(ctx, u, metav1.UpdateOptions{})
		require.NoError(c.t, err)
		return
	}
	_, err := pools.Create(ctx, u, metav1.CreateOptions{})
	require.NoError(c.t, err)
}

func (c *cluster) put(p *corev1.Pod) {
	c.t.Helper()
	pods := c.core.CoreV1().Pods(ns)
	if _, err := pods.Get(context.Background(), p.Name, metav1.GetOptions{}); err == nil {
		_, err = pods.Update(context.Background(), p, metav1.UpdateOptions{})
		require.NoError(c.t, err)
		return
	}
	_, err := pods.Create(context.Background(), p, metav1.CreateOptions{})
	require.NoError(c.t, err)
}

func (c *cluster) delete(name string) {
	c.t.Helper()
	require.NoError(c.t, c.core.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{}))
}

// eventually waits until the router's candidates are want (name → address), and the
// runner has applied them: the fleet gives the router its workers before it drops the
// removed ones from the index, so the router's set alone does not say the apply has
// ended. The deadline only bounds a broken watch: the fake API server answers at once.
func (c *cluster) eventually(want map[string]string) {
	c.t.Helper()
	byName := func(ws []router.Worker) map[string]string {
		got := map[string]string{}
		for _, w := range ws {
			got[w.Name] = w.Address
		}
		return got
	}
	require.Eventually(c.t, func() bool {
		return assert.ObjectsAreEqual(want, byName(c.router.Workers())) && assert.ObjectsAreEqual(want, byName(c.runner.Workers()))
	}, time.Minute, 5*time.Millisecond, "router workers never became %v (have %v, applied %v)", want, c.router.Workers(), c.runner.Workers())
}

// route routes a chat request and releases it, returning the chosen address.
func (c *cluster) route(model, text string) (string, error) {
	d, err := c.router.Route(context.Background(), &router.Request{Model: model,
		Chat: tokenize.TextChat("user", text)})
	if err != nil {
		return "", err
	}
	d.Release()
	return d.Address, nil
}

const prompt = "the same long prompt that fills several blocks of four approximate tokens each"

func TestPodsThroughToRoutingDecisions(t *testing.T) {
	c := newCluster(t, discovery.KubernetesConfig{}, 0)
	require.Eventually(t, c.runner.Synced, time.Minute, 5*time.Millisecond)
	assert.False(t, c.runner.Ready(), "no pool yet: synced with no workers, not ready")

	c.pool(map[string]string{"app": "vllm"}, 8000)
	c.put(pod("vllm-0", "10.0.0.1", notReady))
	c.eventually(map[string]string{})
	require.Eventually(t, c.runner.Ready, time.Minute, 5*time.Millisecond, "a pool with no ready pod is ready: its requests get kvroute's 503")

	// Becoming ready makes a pod a worker, and requests go to it.
	c.put(pod("vllm-0", "10.0.0.1"))
	c.eventually(map[string]string{"vllm-0": "10.0.0.1:8000"})
	assert.True(t, c.runner.Ready())
	addr, err := c.route("m", prompt)
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.1:8000", addr)
	assert.Positive(t, c.index.WorkerEntries("vllm-0"), "the decision recorded its blocks")

	c.put(pod("vllm-1", "10.0.0.2"))
	c.eventually(map[string]string{"vllm-0": "10.0.0.1:8000", "vllm-1": "10.0.0.2:8000"})
	addr, err = c.route("m", prompt)
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.1:8000", addr, "the prefix holder keeps its session")

	// Losing readiness takes the pod out: its sessions move.
	c.put(pod("vllm-0", "10.0.0.1", notReady))
	c.eventually(map[string]string{"vllm-1": "10.0.0.2:8000"})
	assert.Zero(t, c.index.WorkerEntries("vllm-0"), "a removed worker's index entries go")
	addr, err = c.route("m", prompt)
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.2:8000", addr)

	// A new IP is another engine: same worker name, new address, empty cache.
	require.Positive(t, c.index.WorkerEntries("vllm-1"))
	c.put(pod("vllm-1", "10.0.0.3"))
	c.eventually(map[string]string{"vllm-1": "10.0.0.3:8000"})
	assert.Zero(t, c.index.WorkerEntries("vllm-1"), "its old engine's blocks are forgotten")

	// Deleted.
	c.put(pod("vllm-0", "10.0.0.1"))
	c.eventually(map[string]string{"vllm-0": "10.0.0.1:8000", "vllm-1": "10.0.0.3:8000"})
	c.delete("vllm-1")
	c.eventually(map[string]string{"vllm-0": "10.0.0.1:8000"})
	addr, err = c.route("m", prompt)
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.1:8000", addr)

	// Terminating (deletion timestamp set, still running): no new requests.
	c.put(pod("vllm-0", "10.0.0.1", terminating))
	c.eventually(map[string]string{})
	assert.True(t, c.runner.Ready(), "a pool scaled to zero stays ready")
	_, err = c.route("m", prompt)
	assert.ErrorIs(t, err, router.ErrNoWorkers, "an empty pool is 503, not 404: the model may come back")
}

func TestPoolChangesReachTheRouter(t *testing.T) {
	c := newCluster(t, discovery.KubernetesConfig{ModelsAnnotation: "kvroute.io/models"}, 0)
	c.pool(map[string]string{"app": "vllm"}, 8000)
	c.put(pod("a", "10.0.0.1", annotated("qwen")))
	c.put(pod("b", "10.0.0.2", labelled("vllm-next"), annotated("llama")))
	c.eventually(map[string]string{"a": "10.0.0.1:8000"})

	// Another port.
	c.pool(map[string]string{"app": "vllm"}, 8080)
	c.eventually(map[string]string{"a": "10.0.0.1:8080"})

	// Several ports: a worker per (pod, port).
	c.pool(map[string]string{"app": "vllm"}, 8000, 8001)
	c.eventually(map[string]string{"a:8000": "10.0.0.1:8000", "a:8001": "10.0.0.1:8001"})

	// Another selector.
	c.pool(map[string]string{"app": "vllm-next"}, 8000)
	c.eventually(map[string]string{"b": "10.0.0.2:8000"})
	addr, err := c.route("llama", prompt)
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.2:8000", addr, "models come from the pod's annotation")
	_, err = c.route("qwen", prompt)
	assert.ErrorIs(t, err, router.ErrModelNotFound, "pod a left the pool with its model")

	// An invalid pool keeps the workers in force, whatever the pods do meanwhile.
	before := c.applies.count()
	c.pool(map[string]string{"app": "vllm-next"}) // no target ports
	require.Eventually(t, func() bool { return c.sink.rejected() >= 1 }, time.Minute, 5*time.Millisecond)
	updates, rejects := c.sink.count(), c.sink.rejected()
	c.put(pod("c", "10.0.0.9", labelled("vllm-next"))) // a change that would add a worker
	require.Eventually(t, func() bool { return c.sink.rejected() > rejects }, time.Minute, 5*time.Millisecond)
	assert.Equal(t, before, c.applies.count(), "no set applied from an invalid pool")
	assert.Equal(t, updates, c.sink.count())
	c.eventually(map[string]string{"b": "10.0.0.2:8000"})
	assert.True(t, c.runner.Ready())

	// The pool deleted: no workers, and not ready.
	require.NoError(t, c.dyn.Resource(PoolResource()).Namespace(ns).Delete(context.Background(), "qwen", metav1.DeleteOptions{}))
	c.eventually(map[string]string{})
	require.Eventually(t, func() bool { return !c.runner.Ready() }, time.Minute, 5*time.Millisecond, "a deleted pool is not ready")
}

// An InferencePool's appProtocol says how its model servers speak: the workers it makes
// carry it, through the fleet, to the targets health probes, metric scrapes and model
// lists poll, which speak h2c to an h2c pool's engines.
func TestThePoolsAppProtocolReachesThePolledTargets(t *testing.T) {
	c := newCluster(t, discovery.KubernetesConfig{}, 0)
	c.put(pod("a", "10.0.0.1"))
	for _, step := range []struct {
		name, appProtocol string
		wantProtocol      string
	}{
		{"kubernetes.io/h2c: h2c", "kubernetes.io/h2c", router.ProtocolH2C},
		{"http: HTTP/1.1", "http", ""},
		{"unset (the CRD's default, http): HTTP/1.1", "", ""},
		{"back to h2c: the change reaches the same worker", "kubernetes.io/h2c", router.ProtocolH2C},
	} {
		t.Run(step.name, func(t *testing.T) {
			c.poolSpeaking(step.appProtocol, map[string]string{"app": "vllm"}, 8000)
			want := []router.Worker{{Name: "a", Address: "10.0.0.1:8000", Protocol: step.wantProtocol}}
			require.Eventually(t, func() bool {
				return assert.ObjectsAreEqual(want, c.runner.Workers())
			}, time.Minute, 5*time.Millisecond, "applied %v", c.runner.Workers())
			assert.Equal(t, want, c.router.Workers())
			assert.Equal(t, []poll.Target{{Name: "a", Address: "10.0.0.1:8000", H2C: step.wantProtocol == router.ProtocolH2C}}, c.watched.last())
		})
	}
}

func TestAPodWhoseAnnotationNamesALoRAAdapterIsLeftOutAlone(t *testing.T) {
	// A pod's annotation may name one of the config's lora_adapters as a model (the
	// fleet refuses such a worker): that pod is left out, and the pool's other pods
	// keep coming and going.
	c := newCluster(t, discovery.KubernetesConfig{ModelsAnnotation: "kvroute.io/models"}, 0,
		router.LoRAAdapter{Name: "qwen-lora", BaseModel: "qwen"})
	c.pool(map[string]string{"app": "vllm"}, 8000)
	c.put(pod("a", "10.0.0.1", annotated("qwen")))
	c.eventually(map[string]string{"a": "10.0.0.1:8000"})

	c.put(pod("bad", "10.0.0.2", annotated("qwen,qwen-lora")))
	c.put(pod("c", "10.0.0.3", annotated("qwen")))
	c.eventually(map[string]string{"a": "10.0.0.1:8000", "c": "10.0.0.3:8000"})
	c.delete("a")
	c.eventually(map[string]string{"c": "10.0.0.3:8000"})
	assert.Zero(t, c.sink.rejected(), "one pod's annotation does not reject the pool's set")
}

func TestInformerResyncChangesNothing(t *testing.T) {
	c := newCluster(t, discovery.KubernetesConfig{}, 20*time.Millisecond)
	c.pool(map[string]string{"app": "vllm"}, 8000)
	c.put(pod("a", "10.0.0.1"))
	c.eventually(map[string]string{"a": "10.0.0.1:8000"})
	_, err := c.route("m", prompt)
	require.NoError(t, err)
	entries, applies, updates := c.index.WorkerEntries("a"), c.applies.count(), c.sink.count()
	require.Positive(t, entries)

	// Resyncs replay the caches: the source reports the same set again and again.
	require.Eventually(t, func() bool { return c.sink.count() >= updates+3 }, time.Minute, 5*time.Millisecond)
	assert.Equal(t, applies, c.applies.count(), "an unchanged set is not applied")
	assert.Equal(t, entries, c.index.WorkerEntries("a"), "the index keeps the worker's blocks")
}

func TestNewNeedsANamespaceAndClients(t *testing.T) {
	_, err := New(discovery.KubernetesConfig{Pool: "p"}, Deps{Clients: &Clients{Core: fake.NewClientset(),
		Dynamic: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())}})
	assert.ErrorContains(t, err, "discovery.kubernetes.namespace")
	_, err = New(discovery.KubernetesConfig{Pool: "p", Namespace: "x"}, Deps{Clients: &Clients{}})
	assert.ErrorContains(t, err, "clients are required")
	_, err = New(discovery.KubernetesConfig{Pool: "p", Kubeconfig: "/nonexistent/kubeconfig"}, Deps{})
	assert.ErrorContains(t, err, "discovery.kubernetes.kubeconfig")
	s, err := New(discovery.KubernetesConfig{Pool: "p"}, Deps{Clients: &Clients{Core: fake.NewClientset(),
		Dynamic: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()), Namespace: "from-sa"}})
	require.NoError(t, err)
	assert.Equal(t, "from-sa", s.Namespace())
}

// A pod's active-ports annotation says which of the pool's target ports it serves now
// (data-parallel ranks): the upstream pickers make endpoints of only those, an empty
// value none, no annotation all (llm-d-router pkg/epp/datastore/datastore.go reads
// llm-d.ai/active-ports, then the GIE key inference.networking.k8s.io/active-ports,
// which GIE's reference picker reads, pkg/lwepp/datastore/datastore.go). kvroute made
// a worker of every target port, sending requests to ranks that were not serving.
func TestActivePortsAnnotationLimitsAPodsWorkers(t *testing.T) {
	activePorts := func(key, v string) func(*corev1.Pod) {
		return func(p *corev1.Pod) { p.Annotations = map[string]string{key: v} }
	}
	c := newCluster(t, discovery.KubernetesConfig{}, 0)
	c.pool(map[string]string{"app": "vllm"}, 8000, 8001, 8002)
	c.put(pod("a", "10.0.0.1", activePorts("llm-d.ai/active-ports", "8000, 8002,9999")))
	c.put(pod("b", "10.0.0.2", activePorts("inference.networking.k8s.io/active-ports", "8001")))
	c.put(pod("c", "10.0.0.3", activePorts("llm-d.ai/active-ports", "")))
	c.put(pod("d", "10.0.0.4"))
	c.eventually(map[string]string{
		"a:8000": "10.0.0.1:8000", "a:8002": "10.0.0.1:8002",
		"b:8001": "10.0.0.2:8001",
		"d:8000": "10.0.0.4:8000", "d:8001": "10.0.0.4:8001", "d:8002": "10.0.0.4:8002",
	})

	// The annotation changes with the ranks; llm-d's key wins over GIE's.
	c.put(pod("a", "10.0.0.1", activePorts("llm-d.ai/active-ports", "8001")))
	c.put(pod("b", "10.0.0.2", func(p *corev1.Pod) {
		p.Annotations = map[string]string{"llm-d.ai/active-ports": "8002", "inference.networking.k8s.io/active-ports": "8000"}
	}))
	c.put(pod("c", "10.0.0.3"))
	c.eventually(map[string]string{
		"a:8001": "10.0.0.1:8001",
		"b:8002": "10.0.0.2:8002",
		"c:8000": "10.0.0.3:8000", "c:8001": "10.0.0.3:8001", "c:8002": "10.0.0.3:8002",
		"d:8000": "10.0.0.4:8000", "d:8001": "10.0.0.4:8001", "d:8002": "10.0.0.4:8002",
	})
}

// An InferencePool marked for deletion (a finalizer holds it, or a foreground delete
// waits for its dependents) is a pool going away: GIE's and llm-d's endpoint pickers
// clear their datastores on its deletion timestamp, as on its absence
// (InferencePoolReconciler.Reconcile), and so turn unready. kvroute kept routing to
// its pods and stayed ready until the object was gone, which a stuck finalizer makes
// never.
func TestAPoolMarkedForDeletionIsMissing(t *testing.T) {
	c := newCluster(t, discovery.KubernetesConfig{}, 0)
	c.pool(map[string]string{"app": "vllm"}, 8000)
	c.put(pod("a", "10.0.0.1"))
	c.eventually(map[string]string{"a": "10.0.0.1:8000"})
	require.Eventually(t, c.runner.Ready, time.Minute, 5*time.Millisecond)

	pools := c.dyn.Resource(PoolResource()).Namespace(ns)
	ctx := context.Background()
	u, err := pools.Get(ctx, "qwen", metav1.GetOptions{})
	require.NoError(t, err)
	now := metav1.Now()
	u.SetDeletionTimestamp(&now)
	u.SetFinalizers([]string{"gateway.example.com/finalizer"})
	_, err = pools.Update(ctx, u, metav1.UpdateOptions{})
	require.NoError(t, err)
	c.eventually(map[string]string{})
	require.Eventually(t, func() bool { return !c.runner.Ready() }, time.Minute, 5*time.Millisecond, "a pool being deleted is not ready")
	assert.Contains(t, c.log.String(), "InferencePool marked for deletion")

	// Gone, then made anew: its pods are workers again.
	require.NoError(t, pools.Delete(ctx, "qwen", metav1.DeleteOptions{}))
	c.pool(map[string]string{"app": "vllm"}, 8000)
	c.eventually(map[string]string{"a": "10.0.0.1:8000"})
	require.Eventually(t, c.runner.Ready, time.Minute, 5*time.Millisecond)
}
