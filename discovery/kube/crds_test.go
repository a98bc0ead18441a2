package kube

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kvroute/kvroute/discovery"
)

// InferenceObjectives and InferenceModelRewrites are each followed through the same
// periodic discovery check, in the group the API server serves them in: llm-d.ai
// (llm-d-router's) where it is served there, else the legacy
// inference.networking.x-k8s.io (GIE's, v1.0 to v1.5), as llm-d-router's picker chooses
// per kind at its start (pkg/epp/server/controller_config.go); a CRD installed after
// kvroute started, removed, moved to the other group or installed again is followed
// from the next check. Before, model rewrites were read only where their CRD was
// served at start, and only in the legacy group.
func TestEachKindIsFollowedInTheGroupThatServesIt(t *testing.T) {
	c := startCluster(t, discovery.KubernetesConfig{}, 0, false)
	c.objectiveIn(legacy, "batch", "qwen", "", prio(7))
	c.objectiveIn(llmd, "batch", "qwen", "", prio(-2))
	putRewrite(t, c.dyn, legacy, "alias", "qwen", "", 100, rule([]string{"small"}, to("small-legacy", 0)))
	putRewrite(t, c.dyn, llmd, "alias", "qwen", "", 100, rule([]string{"small"}, to("small-llmd", 0)))
	c.pool(map[string]string{"app": "vllm"}, 8000)
	c.put(pod("vllm-0", "10.0.0.1"))
	c.eventually(map[string]string{"vllm-0": "10.0.0.1:8000"})
	c.eventuallyObjectives(map[string]any{"batch": "undefined"})
	eventuallyRewrites(t, c.rewrites, map[string]string{"small": ""})

	// Both CRDs installed in the legacy group after the start.
	c.discovery.serve(legacy, ObjectivesResource, ModelRewritesResource)
	c.eventuallyObjectives(map[string]any{"batch": 7})
	eventuallyRewrites(t, c.rewrites, map[string]string{"small": "alias/small-legacy"})

	// The objectives' CRD of llm-d.ai installed too: its objects are read instead, the
	// legacy ones ignored (logged); the rewrites stay in the group that serves them.
	c.discovery.serve(llmd, ObjectivesResource)
	c.eventuallyObjectives(map[string]any{"batch": -2})
	eventuallyRewrites(t, c.rewrites, map[string]string{"small": "alias/small-legacy"})
	assert.Contains(t, c.log.String(), "InferenceObjectives are served in both groups")

	c.discovery.serve(llmd, ObjectivesResource, ModelRewritesResource)
	eventuallyRewrites(t, c.rewrites, map[string]string{"small": "alias/small-llmd"})
	assert.Contains(t, c.log.String(), "InferenceModelRewrites are served in both groups")

	// The llm-d.ai rewrites' CRD removed: back to the legacy ones.
	c.discovery.serve(llmd, ObjectivesResource)
	eventuallyRewrites(t, c.rewrites, map[string]string{"small": "alias/small-legacy"})

	// Moved to a group holding none of the pool's rewrites: the set is the new group's,
	// empty, not the old group's.
	require.NoError(t, c.dyn.Resource(ModelRewriteResource(llmd)).Namespace(ns).Delete(context.Background(), "alias", metav1.DeleteOptions{}))
	c.discovery.serve(legacy)
	c.discovery.serve(llmd, ObjectivesResource, ModelRewritesResource)
	eventuallyRewrites(t, c.rewrites, map[string]string{"small": ""})
	c.eventuallyObjectives(map[string]any{"batch": -2})

	// Discovery failing changes nothing.
	c.discovery.fail(true)
	putRewrite(t, c.dyn, llmd, "alias", "qwen", "", 100, rule([]string{"small"}, to("small-llmd-2", 0)))
	eventuallyRewrites(t, c.rewrites, map[string]string{"small": "alias/small-llmd-2"})
	c.discovery.fail(false)

	// Both removed everywhere: the cluster's sets are dropped.
	c.discovery.serve(llmd)
	c.eventuallyObjectives(map[string]any{"batch": "undefined"})
	eventuallyRewrites(t, c.rewrites, map[string]string{"small": ""})

	// Installed again, in the legacy group: followed again.
	c.discovery.serve(legacy, ObjectivesResource, ModelRewritesResource)
	c.eventuallyObjectives(map[string]any{"batch": 7})
	eventuallyRewrites(t, c.rewrites, map[string]string{"small": "alias/small-legacy"})
	c.eventually(map[string]string{"vllm-0": "10.0.0.1:8000"})
}

// A kind never read, discovery failing from the start, is watched in the preferred
// group (its informer's retries say why, if wrongly) until a read succeeds, as the
// objectives were watched before on a first read that failed.
func TestAFailingFirstCheckWatchesThePreferredGroupUntilARead(t *testing.T) {
	// Failing from before the start: a first check that succeeded (nothing served)
	// would decide before the failures, and they change nothing.
	c := startClusterWith(t, discovery.KubernetesConfig{}, 0, false, func(c *cluster) { c.discovery.fail(true) })
	c.objectiveIn(llmd, "batch", "qwen", "", prio(-2))
	c.objectiveIn(legacy, "batch", "qwen", "", prio(7))
	c.pool(map[string]string{"app": "vllm"}, 8000)
	c.put(pod("vllm-0", "10.0.0.1"))
	c.eventually(map[string]string{"vllm-0": "10.0.0.1:8000"})
	// The fake serves the objects whatever discovery says.
	c.eventuallyObjectives(map[string]any{"batch": -2})
	c.discovery.serve(legacy, ObjectivesResource)
	c.discovery.fail(false)
	c.eventuallyObjectives(map[string]any{"batch": 7})
}

// TestAForbiddenListNamesTheGrantItLacks: a kind served in a group kvroute's Role does
// not cover (an upgrade to llm-d.ai's CRDs keeping the old Role) is not read, and the
// log says which grant is missing, group included, not only the API server's words.
func TestAForbiddenListNamesTheGrantItLacks(t *testing.T) {
	c := startClusterWith(t, discovery.KubernetesConfig{}, 0, false, func(c *cluster) {
		c.dyn.PrependReactor("list", ModelRewritesResource, func(action k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(action.GetResource().GroupResource(), "", errors.New("RBAC: access denied"))
		})
	})
	c.pool(map[string]string{"app": "vllm"}, 8000)
	c.put(pod("vllm-0", "10.0.0.1"))
	c.eventually(map[string]string{"vllm-0": "10.0.0.1:8000"})
	c.discovery.serve(llmd, ModelRewritesResource)
	assert.Eventually(t, func() bool {
		return strings.Contains(c.log.String(), "grant get, list and watch on inferencemodelrewrites.llm-d.ai")
	}, 5*time.Second, 5*time.Millisecond)
	if t.Failed() {
		t.Log(c.log.String())
	}
}
