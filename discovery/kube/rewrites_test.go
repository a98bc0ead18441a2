package kube

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/rewrite"
	"github.com/kvroute/kvroute/router"
)

// nullSink takes the worker sets and drops them: these tests read the rewrites.
type nullSink struct{}

func (nullSink) Update([]router.Worker) {}
func (nullSink) Reject(error)           {}
func (nullSink) Missing(error)          {}

// rewriteCluster is a fake API server serving InferenceModelRewrites in the legacy
// group (served: their CRD installed) and a source of pool "qwen" feeding table.
type rewriteCluster struct {
	t         *testing.T
	dyn       *dynamicfake.FakeDynamicClient
	table     *rewrite.Table
	discovery *fakeDiscovery
	log       *lockedBuffer
}

func startRewriteCluster(t *testing.T, served bool) *rewriteCluster {
	t.Helper()
	core := fake.NewClientset()
	c := &rewriteCluster{t: t, table: rewrite.NewTable(nil, nil, nil), discovery: newFakeDiscovery(core), log: &lockedBuffer{},
		dyn: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), gieListKinds())}
	if served {
		c.discovery.serve(legacy, ModelRewritesResource)
	}
	// The fake answers discovery at once: checking often costs nothing.
	src, err := New(discovery.KubernetesConfig{Pool: "qwen"}, Deps{Clients: &Clients{Core: withDiscovery{Clientset: core, d: c.discovery}, Dynamic: c.dyn, Namespace: ns},
		Rewrites: c.table, CRDCheck: 5 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(c.log, nil))})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = src.Run(ctx, nullSink{}) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// put creates or replaces an InferenceModelRewrite of pool (group "": the default) in
// the legacy group, created at the given second.
func (c *rewriteCluster) put(name, pool, group string, created int64, rules ...any) {
	c.t.Helper()
	putRewrite(c.t, c.dyn, legacy, name, pool, group, created, rules...)
}

// putRewrite creates or replaces an InferenceModelRewrite in gv.
func putRewrite(t *testing.T, dyn *dynamicfake.FakeDynamicClient, gv schema.GroupVersion, name, pool, group string, created int64, rules ...any) {
	t.Helper()
	poolRef := map[string]any{"name": pool}
	if group != "" {
		poolRef["group"] = group
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gv.String(), "kind": "InferenceModelRewrite",
		"metadata": map[string]any{"name": name, "namespace": ns, "creationTimestamp": time.Unix(created, 0).UTC().Format(time.RFC3339)},
		"spec":     map[string]any{"poolRef": poolRef, "rules": rules},
	}}
	res := dyn.Resource(ModelRewriteResource(gv)).Namespace(ns)
	ctx := context.Background()
	if existing, err := res.Get(ctx, name, metav1.GetOptions{}); err == nil {
		u.SetResourceVersion(existing.GetResourceVersion())
		_, err = res.Update(ctx, u, metav1.UpdateOptions{})
		require.NoError(t, err)
		return
	}
	_, err := res.Create(ctx, u, metav1.CreateOptions{})
	require.NoError(t, err)
}

// rule is a rule of the CRD: exact matches (none: generic) and targets "model" or
// "model=weight".
func rule(models []string, targets ...map[string]any) map[string]any {
	var matches []any
	for _, m := range models {
		matches = append(matches, map[string]any{"model": map[string]any{"type": "Exact", "value": m}})
	}
	var ts []any
	for _, t := range targets {
		ts = append(ts, t)
	}
	r := map[string]any{"targets": ts}
	if matches != nil {
		r["matches"] = matches
	}
	return r
}

func to(model string, weight int64) map[string]any {
	t := map[string]any{"modelRewrite": model}
	if weight > 0 {
		t["weight"] = weight
	}
	return t
}

// eventually waits until each model is rewritten as want says (rewrite/target, or ""
// for none). The deadline only bounds a broken watch: the fake API server answers at once.
func (c *rewriteCluster) eventually(want map[string]string) {
	c.t.Helper()
	eventuallyRewrites(c.t, c.table, want)
}

func eventuallyRewrites(t *testing.T, table *rewrite.Table, want map[string]string) {
	t.Helper()
	got := func() map[string]string {
		out := map[string]string{}
		for model := range want {
			if ch, ok := table.Choose(model); ok {
				out[model] = ch.Rewrite + "/" + ch.Target
			} else {
				out[model] = ""
			}
		}
		return out
	}
	require.Eventually(t, func() bool { return assert.ObjectsAreEqual(want, got()) }, time.Minute, 5*time.Millisecond,
		"rewrites never became %v (have %v)", want, got())
}

// The pool's InferenceModelRewrites rewrite its requests as GIE's endpoint picker does:
// those naming the pool in the InferencePool's group, an exact match before a generic
// one, the oldest first, followed as they are added, changed and deleted; one kvroute
// cannot use (a rule without targets) is left out whole.
func TestInferenceModelRewritesOfThePoolRewriteRequests(t *testing.T) {
	c := startRewriteCluster(t, true)
	c.put("alias", "qwen", "", 100, rule([]string{"small"}, to("small-v1", 0)))
	c.put("newer-alias", "qwen", "inference.networking.k8s.io", 200, rule([]string{"small", "big"}, to("small-v2", 0)))
	c.put("fallback", "qwen", "", 50, rule(nil, to("base", 0)))
	c.put("other-pool", "llama", "", 10, rule([]string{"mid"}, to("mid-v1", 0)))
	c.put("other-group", "qwen", "example.com", 10, rule([]string{"mid"}, to("mid-v1", 0)))
	c.put("no-targets", "qwen", "", 10, rule([]string{"mid"}))
	c.eventually(map[string]string{
		"small": "alias/small-v1",       // the oldest exact match
		"big":   "newer-alias/small-v2", // exact beats the older generic rule
		"mid":   "fallback/base",        // the others name another pool or group, or are unusable
	})

	// Changed, moved away, deleted.
	c.put("alias", "llama", "", 100, rule([]string{"small"}, to("small-v1", 0)))
	c.eventually(map[string]string{"small": "newer-alias/small-v2"})
	require.NoError(t, c.dyn.Resource(ModelRewriteResource(legacy)).Namespace(ns).Delete(context.Background(), "fallback", metav1.DeleteOptions{}))
	c.put("newer-alias", "qwen", "", 200, rule([]string{"small"}, to("s-a", 1), to("s-b", 1)))
	c.eventually(map[string]string{"mid": "", "big": ""})
	ch, ok := c.table.Choose("small")
	require.True(t, ok)
	assert.Contains(t, []string{"s-a", "s-b"}, ch.Target)
}

// Without the CRD the API server serves none, and kvroute does not watch them: the
// config's rewrites stand alone.
func TestModelRewritesAreNotWatchedWhereTheirCRDIsNotServed(t *testing.T) {
	c := startRewriteCluster(t, false)
	c.table.SetConfigured(rewrite.Config{{Name: "cfg", Rules: []rewrite.Rule{{Models: []string{"small"}, Targets: []rewrite.Target{{Model: "from-config"}}}}}})
	c.put("alias", "qwen", "", 100, rule([]string{"small"}, to("small-v1", 0)))
	c.put("fallback", "qwen", "", 100, rule(nil, to("base", 0)))
	require.Eventually(t, func() bool { return strings.Contains(c.log.String(), "InferenceModelRewrites are not served") },
		5*time.Second, time.Millisecond, "the first check decides")
	// Many checks later, nothing has listed the kind: no informer was started.
	assert.Never(t, func() bool {
		return slices.ContainsFunc(c.dyn.Actions(), func(a k8stesting.Action) bool {
			return a.GetResource().Resource == ModelRewritesResource && (a.GetVerb() == "list" || a.GetVerb() == "watch")
		})
	}, 100*time.Millisecond, 5*time.Millisecond, "InferenceModelRewrites listed or watched where their CRD is not served")
	ch, ok := c.table.Choose("small")
	require.True(t, ok)
	assert.Equal(t, "from-config", ch.Target)
	_, ok = c.table.Choose("mid")
	assert.False(t, ok, "the cluster's generic rewrite was never read")
}

// An InferenceModelRewrite with weights on some targets of a rule only is kept, its
// targets without a weight never drawn, with a warning, as llm-d-router's picker draws
// (requestcontrol/director.go, selectWeightedModel). kvroute left the whole object out.
func TestMixedWeightsKeepTheRewriteAndNeverDrawTheUnweighted(t *testing.T) {
	c := startRewriteCluster(t, true)
	c.put("canary", "qwen", "", 100,
		rule([]string{"big"}, to("big-unweighted", 0), to("big-v1", 5)),
		rule([]string{"small"}, to("small-v1", 0)))
	c.eventually(map[string]string{"big": "canary/big-v1", "small": "canary/small-v1"})
	for range 50 {
		ch, ok := c.table.Choose("big")
		require.True(t, ok)
		assert.Equal(t, "big-v1", ch.Target)
	}
	assert.Contains(t, c.log.String(), "canary: kept, but spec.rules[0].targets: weights are set on every target of a rule or on none: 1 of 2 have one: the targets without one are never drawn")
}
