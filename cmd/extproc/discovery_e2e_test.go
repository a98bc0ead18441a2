package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/discovery/kube"
	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/internal/fakeworker"
	"github.com/kvroute/kvroute/mockworker"
	"github.com/kvroute/kvroute/sim"
)

// running is extproc built from a config, serving on loopback behind a test data plane.
type running struct {
	app      *app
	adminURL string
	health   healthpb.HealthClient
	envoy    *envoytest.Server
}

func serveApp(t *testing.T, cfg config.Config, opts ...buildOption) *running {
	t.Helper()
	require.NoError(t, cfg.Validate())
	a, err := build(cfg, func() (config.Config, error) { return cfg, nil }, discardLogger(), opts...)
	require.NoError(t, err)
	grpcAddr, adminAddr := serveOnLoopback(t, a)
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	env := envoytest.NewServer(envoytest.Config{
		ProcessorAddress: grpcAddr, SendProtocolConfig: true, MessageTimeout: 5 * time.Second,
		ProcessingMode: &extprocfilterv3.ProcessingMode{RequestBodyMode: extprocfilterv3.ProcessingMode_BUFFERED,
			ResponseBodyMode: extprocfilterv3.ProcessingMode_STREAMED},
		ReceivingNamespaces: []string{"envoy.lb"}, DestinationHeader: cfg.Filter.DestinationHeader,
	})
	t.Cleanup(func() { assert.NoError(t, env.Close()) })
	return &running{app: a, adminURL: "http://" + adminAddr, health: healthpb.NewHealthClient(conn), envoy: env}
}

// ask sends one chat request through the data plane; it returns the upstream that
// served it and the status the client got.
func (r *running) ask(t *testing.T, model, text string) (string, int) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"user","content":%q}]}`, model, text)
	resp, err := http.Post(r.envoy.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	exchanges := r.envoy.Exchanges()
	return exchanges[len(exchanges)-1].Upstream, resp.StatusCode
}

func (r *running) status(t *testing.T, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	resp, err := r.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
	require.NoError(t, err)
	return resp.GetStatus()
}

// ready reports readiness as every probe sees it: the gRPC services and /readyz agree.
// /readyz asks discovery at once while the gRPC statuses are published just after a
// worker set is applied, so they may disagree for that moment: wait until they agree.
func (r *running) ready(t *testing.T) bool {
	t.Helper()
	var ready bool
	require.Eventually(t, func() bool {
		resp, err := http.Get(r.adminURL + "/readyz")
		require.NoError(t, err)
		resp.Body.Close()
		ready = resp.StatusCode == http.StatusOK
		for _, svc := range []string{"", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"} {
			if ready != (r.status(t, svc) == healthpb.HealthCheckResponse_SERVING) {
				return false
			}
		}
		return true
	}, time.Minute, 5*time.Millisecond, "the gRPC health services agree with /readyz")
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, r.status(t, "liveness"), "liveness stays up")
	return ready
}

func (r *running) metrics(t *testing.T) string {
	t.Helper()
	resp, err := http.Get(r.adminURL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

// mockPair starts two simulated vLLM workers on one port of two loopback addresses, as
// two pods' IPs behind one InferencePool target port.
// The second engine (127.0.0.3) has also loaded LoRA adapter sql of qwen, and lists it
// on /v1/models as vLLM does.
func mockPair(t *testing.T, numGPUBlocks int) (port int) {
	t.Helper()
	first, err := net.Listen("tcp", "127.0.0.2:0")
	require.NoError(t, err)
	port = first.Addr().(*net.TCPAddr).Port
	second, err := net.Listen("tcp", fmt.Sprintf("127.0.0.3:%d", port))
	require.NoError(t, err)
	for i, ln := range []net.Listener{first, second} {
		var adapters map[string]string
		if i == 1 {
			adapters = map[string]string{"sql": "qwen"}
		}
		w, err := mockworker.New(mockworker.Config{Name: fmt.Sprintf("engine-%d", i), Speed: 1000, Seed: 1, LoRAAdapters: adapters,
			Engine: sim.Config{NumGPUBlocks: numGPUBlocks, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 2048}})
		require.NoError(t, err)
		srv := &http.Server{Handler: w.Handler(), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close(); w.Close() })
	}
	return port
}

func podAt(name, ip string, ready bool) *corev1.Pod {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "llm", Labels: map[string]string{"app": "qwen"}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}},
	}
}

func TestKubernetesDiscoveryEndToEnd(t *testing.T) {
	port := mockPair(t, 512)
	core := fake.NewClientset()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{kube.PoolResource(): "InferencePoolList"})
	cfg := config.Default()
	cfg.Router.BlockSize = 16
	cfg.EngineMetrics.Interval = 20 * time.Millisecond
	cfg.EngineModels.Interval = 20 * time.Millisecond
	cfg.Discovery = discovery.Config{Source: discovery.SourceKubernetes,
		Kubernetes: discovery.KubernetesConfig{Pool: "qwen", Namespace: "llm"}}
	r := serveApp(t, cfg, withKubeClients(&kube.Clients{Core: core, Dynamic: dyn}, 0))
	ctx := context.Background()

	// No pool yet: alive, not ready, and a request that arrives anyway gets a 503.
	require.Eventually(t, r.app.runner.Synced, time.Minute, 5*time.Millisecond)
	assert.False(t, r.ready(t))
	_, status := r.ask(t, "qwen", "hello")
	assert.Equal(t, http.StatusServiceUnavailable, status)

	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "qwen", "namespace": "llm"},
		"spec": map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": "qwen"}},
			"targetPorts": []any{map[string]any{"number": int64(port)}}},
	}}
	_, err := dyn.Resource(kube.PoolResource()).Namespace("llm").Create(ctx, pool, metav1.CreateOptions{})
	require.NoError(t, err)
	// A pool with no pod: ready (as upstream pickers are), and kvroute answers the 503.
	require.Eventually(t, func() bool { return r.ready(t) }, time.Minute, 10*time.Millisecond, "ready once the pool exists")
	_, status = r.ask(t, "qwen", "hello")
	assert.Equal(t, http.StatusServiceUnavailable, status)
	pods := core.CoreV1().Pods("llm")
	_, err = pods.Create(ctx, podAt("qwen-a", "127.0.0.2", false), metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = pods.Create(ctx, podAt("qwen-b", "127.0.0.3", true), metav1.CreateOptions{})
	require.NoError(t, err)

	addrA, addrB := fmt.Sprintf("127.0.0.2:%d", port), fmt.Sprintf("127.0.0.3:%d", port)
	var upstream string
	require.Eventually(t, func() bool { upstream, status = r.ask(t, "qwen", "first"); return status == 200 }, time.Minute, 10*time.Millisecond, "served once a pod is ready")
	assert.Equal(t, []any{addrB, 200}, []any{upstream, status}, "only the ready pod serves")

	// The engine's num_gpu_blocks, scraped, bounds the worker's index entries.
	require.Eventually(t, func() bool {
		return strings.Contains(r.metrics(t), `kvroute_worker_capacity_blocks{source="scraped",worker="qwen-b"} 512`)
	}, time.Minute, 10*time.Millisecond)

	// qwen-a becomes ready. Each discovered pod's model list is read: requests for sql,
	// an adapter no config declares, go only to qwen-b, the pod that has loaded it.
	_, err = pods.Update(ctx, podAt("qwen-a", "127.0.0.2", true), metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, knownA := r.app.models.ServesAdapter("qwen-a", "sql")
		_, knownB := r.app.models.ServesAdapter("qwen-b", "sql")
		return knownA && knownB
	}, time.Minute, 10*time.Millisecond, "the discovered pods' model lists")
	for i := range 4 {
		upstream, status := r.ask(t, "sql", fmt.Sprint("an adapter's prompt ", i))
		assert.Equal(t, []any{addrB, 200}, []any{upstream, status}, "sql only where it is loaded")
	}

	// qwen-b stops being ready: its session moves.
	_, err = pods.Update(ctx, podAt("qwen-b", "127.0.0.3", false), metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { u, _ := r.ask(t, "qwen", "first"); return u == addrA }, time.Minute, 10*time.Millisecond)

	// Every pod gone: still ready, and kvroute's 503 rather than 404.
	require.NoError(t, pods.Delete(ctx, "qwen-a", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { _, status = r.ask(t, "qwen", "first"); return status == http.StatusServiceUnavailable },
		time.Minute, 10*time.Millisecond)
	assert.True(t, r.ready(t), "a pool scaled to zero stays ready")
	// Checked after a later fleet change: a request routed to qwen-b just before it
	// left counts under its name when it ends, until the next change (filter.SetWorkers).
	assert.NotContains(t, r.metrics(t), `worker="qwen-b"`, "a removed worker's series go: pod names must not pile up")

	// The pool deleted: not ready.
	require.NoError(t, dyn.Resource(kube.PoolResource()).Namespace("llm").Delete(ctx, "qwen", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { return !r.ready(t) }, time.Minute, 10*time.Millisecond)
}

func TestFileDiscoveryEndToEnd(t *testing.T) {
	w0, w1 := fakeworker.New("w0"), fakeworker.New("w1")
	defer w0.Close()
	defer w1.Close()
	path := filepath.Join(t.TempDir(), "workers.yaml")
	put := func(content string) {
		t.Helper()
		tmp := path + ".tmp"
		require.NoError(t, os.WriteFile(tmp, []byte(content), 0o600))
		require.NoError(t, os.Rename(tmp, path)) // as editors and config tools write
	}
	entry := func(w *fakeworker.Worker) string {
		return fmt.Sprintf("  - {name: %s, address: %q}\n", w.Name, w.Address)
	}
	put("workers:\n" + entry(w0))
	cfg := config.Default()
	cfg.Router.BlockSize = 4
	cfg.Discovery = discovery.Config{Source: discovery.SourceFile, File: discovery.FileConfig{Path: path}}
	r := serveApp(t, cfg)
	assert.True(t, r.ready(t), "the file is read at start: ready at once")
	upstream, status := r.ask(t, "qwen", "hello")
	assert.Equal(t, []any{w0.Address, 200}, []any{upstream, status})

	put("workers:\n" + entry(w1))
	require.Eventually(t, func() bool { u, _ := r.ask(t, "qwen", "hello"); return u == w1.Address }, time.Minute, 10*time.Millisecond)

	put("workers:\n  - {name: w2, address: 'w2.local:8000'}\n")
	require.Eventually(t, func() bool { return strings.Contains(r.metrics(t), "kvroute_discovery_stale 1") }, time.Minute, 10*time.Millisecond)
	upstream, _ = r.ask(t, "qwen", "hello")
	assert.Equal(t, w1.Address, upstream, "a bad file keeps the workers in force")
	assert.True(t, r.ready(t))

	// A config reload does not touch discovered workers.
	resp, err := http.Post(r.adminURL+"/reload", "", nil)
	require.NoError(t, err)
	summary, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, string(summary))
	assert.Contains(t, string(summary), `"workers":1`)
	assert.Equal(t, []string{"w1"}, r.app.fleet.Names())

	put("workers: []\n")
	require.Eventually(t, func() bool { _, status = r.ask(t, "qwen", "hello"); return status == http.StatusServiceUnavailable },
		time.Minute, 10*time.Millisecond, "an empty fleet answers 503")
	assert.True(t, r.ready(t), "an empty fleet is ready: its requests get kvroute's 503")
}
