package kube

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tokenize"
)

// objective puts an InferenceObjective in the legacy group (v1alpha2, as GIE's CRD
// serves it): priority nil leaves spec.priority unset; group "" leaves poolRef.group to
// its default.
func (c *cluster) objective(name, pool, group string, prio *int64) {
	c.t.Helper()
	c.objectiveIn(legacy, name, pool, group, prio)
}

// objectiveIn is objective in the group version gv.
func (c *cluster) objectiveIn(gv schema.GroupVersion, name, pool, group string, prio *int64) {
	c.t.Helper()
	poolRef := map[string]any{"name": pool, "kind": "InferencePool"}
	if group != "" {
		poolRef["group"] = group
	}
	spec := map[string]any{"poolRef": poolRef}
	if prio != nil {
		spec["priority"] = *prio
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gv.String(), "kind": "InferenceObjective",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     spec,
		"status":   map[string]any{"conditions": []any{map[string]any{"type": "Accepted", "status": "True"}}},
	}}
	objectives := c.dyn.Resource(ObjectiveResource(gv)).Namespace(ns)
	ctx := context.Background()
	if existing, err := objectives.Get(ctx, name, metav1.GetOptions{}); err == nil {
		u.SetResourceVersion(existing.GetResourceVersion())
		_, err = objectives.Update(ctx, u, metav1.UpdateOptions{})
		require.NoError(c.t, err)
		return
	}
	_, err := objectives.Create(ctx, u, metav1.CreateOptions{})
	require.NoError(c.t, err)
}

func prio(p int64) *int64 { return &p }

// eventuallyObjectives waits until the table gives each name its priority (absent: not
// defined). The deadline only bounds a broken watch: the fake API server answers at once.
func (c *cluster) eventuallyObjectives(want map[string]any) {
	c.t.Helper()
	got := func() map[string]any {
		out := map[string]any{}
		for name := range want {
			if p, ok := c.objectives.Priority(name); ok {
				out[name] = p
			} else {
				out[name] = "undefined"
			}
		}
		return out
	}
	require.Eventually(c.t, func() bool { return assert.ObjectsAreEqual(want, got()) }, time.Minute, 5*time.Millisecond,
		"objectives never became %v (have %v)", want, got())
}

// The pool's InferenceObjectives give requests their priorities, as GIE's endpoint
// picker reads them: those naming the pool in the InferencePool's group, an unset
// priority as 0, followed as they are added, changed and deleted.
func TestInferenceObjectivesOfThePoolGiveRequestsTheirPriority(t *testing.T) {
	c := startCluster(t, discovery.KubernetesConfig{}, 0, true)
	c.pool(map[string]string{"app": "vllm"}, 8000)
	c.put(pod("vllm-0", "10.0.0.1"))
	c.eventually(map[string]string{"vllm-0": "10.0.0.1:8000"})

	c.objective("batch", "qwen", "", prio(-1))
	c.objective("chat", "qwen", "inference.networking.k8s.io", prio(10))
	c.objective("unset", "qwen", "", nil)
	c.objective("other-pool", "llama", "", prio(-5))
	c.objective("other-group", "qwen", "example.com", prio(-5))
	c.eventuallyObjectives(map[string]any{"batch": -1, "chat": 10, "unset": 0, "other-pool": "undefined", "other-group": "undefined"})

	// The objectives reach the router: with no engine load read, no worker has capacity
	// for a sheddable request, and any other is served.
	route := func(objective string) error {
		d, err := c.router.Route(context.Background(), &router.Request{Model: "m", Chat: tokenize.TextChat("user", prompt), Objective: objective})
		if err == nil {
			d.Release()
		}
		return err
	}
	assert.ErrorIs(t, route("batch"), router.ErrSaturated)
	assert.NoError(t, route("chat"))
	assert.NoError(t, route("other-pool"), "an objective of another pool names none here: priority 0")

	// Changed, moved to this pool, moved away, deleted.
	c.objective("batch", "qwen", "", prio(3))
	c.objective("other-pool", "qwen", "", prio(-5))
	c.objective("chat", "llama", "", prio(10))
	require.NoError(t, c.dyn.Resource(ObjectiveResource(legacy)).Namespace(ns).Delete(context.Background(), "unset", metav1.DeleteOptions{}))
	c.eventuallyObjectives(map[string]any{"batch": 3, "other-pool": -5, "chat": "undefined", "unset": "undefined"})
	assert.NoError(t, route("batch"))
	assert.ErrorIs(t, route("other-pool"), router.ErrSaturated)
}

// Without the InferenceObjective CRD the API server serves none, and kvroute does not
// watch them (an informer on a missing resource retries and warns forever); the config's
// objectives stand alone, and the workers are discovered as ever.
func TestObjectivesAreNotWatchedWhereTheirCRDIsNotServed(t *testing.T) {
	c := startCluster(t, discovery.KubernetesConfig{}, 0, false)
	c.objectives.SetConfigured(map[string]int{"batch": -1})
	c.objective("batch", "qwen", "", prio(7)) // the fake serves it all the same
	c.pool(map[string]string{"app": "vllm"}, 8000)
	c.put(pod("vllm-0", "10.0.0.1"))
	c.eventually(map[string]string{"vllm-0": "10.0.0.1:8000"})
	p, ok := c.objectives.Priority("batch")
	assert.True(t, ok)
	assert.Equal(t, -1, p, "the config's priority: the cluster's objectives were never read")
}

// An InferenceObjective CRD installed after kvroute started is followed from the next
// discovery check (Deps.CRDCheck), without a restart; one removed drops the cluster's
// objectives (the config's stand alone again); a discovery that fails changes nothing;
// one installed again is followed again. GIE's picker (v1.0 to v1.5) looks only at
// start (pkg/epp/server/controller_config.go, gvkExists).
func TestTheInferenceObjectiveCRDIsFollowedAsItIsInstalledAndRemoved(t *testing.T) {
	c := startCluster(t, discovery.KubernetesConfig{}, 0, false)
	c.objectives.SetConfigured(map[string]int{"batch": -1})
	c.objective("batch", "qwen", "", prio(7)) // the fake serves it all the same
	c.objective("offline", "qwen", "", prio(-3))
	c.pool(map[string]string{"app": "vllm"}, 8000)
	c.put(pod("vllm-0", "10.0.0.1"))
	c.eventually(map[string]string{"vllm-0": "10.0.0.1:8000"})
	c.eventuallyObjectives(map[string]any{"batch": -1, "offline": "undefined"})

	c.setCRD(crdInstalled)
	c.eventuallyObjectives(map[string]any{"batch": 7, "offline": -3})

	// Discovery failing says nothing of the CRD: the watch goes on.
	c.setCRD(crdFailing)
	c.objective("batch", "qwen", "", prio(3))
	c.eventuallyObjectives(map[string]any{"batch": 3, "offline": -3})

	c.setCRD(crdAbsent)
	c.eventuallyObjectives(map[string]any{"batch": -1, "offline": "undefined"})

	// Installed again: a new watch lists what is there now.
	c.objective("offline", "qwen", "", prio(-9))
	c.setCRD(crdInstalled)
	c.eventuallyObjectives(map[string]any{"batch": 3, "offline": -9})
	c.objective("batch", "qwen", "", prio(4))
	c.eventuallyObjectives(map[string]any{"batch": 4, "offline": -9})
	c.eventually(map[string]string{"vllm-0": "10.0.0.1:8000"})
}
