package config

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// recordedFleet is a static fleet that records what it is given.
type recordedFleet struct{ workers []router.Worker }

func (f *recordedFleet) Apply(next []router.Worker) (fleet.Diff, error) {
	f.workers = next
	return fleet.Diff{Workers: len(next)}, nil
}
func (f *recordedFleet) Workers() []router.Worker { return f.workers }

// A file that a reload refuses changes nothing: its workers are not applied when its
// policy is refused after them (a loader that skips validation stands for any check
// the policy makes that the file's parse did not).
func TestAReloadRefusedForItsPolicyLeavesTheWorkers(t *testing.T) {
	running, err := Parse([]byte(minimal))
	require.NoError(t, err)
	next, err := Parse([]byte(`
workers:
  - {name: a, address: "127.0.0.1:8001"}
  - {name: b, address: "127.0.0.1:8002"}
`))
	require.NoError(t, err)
	next.Policy.Params.QueueWeight = -1
	workers := &recordedFleet{workers: running.Router.Workers}
	policy, err := scoring.NewPolicy(running.Policy.Params)
	require.NoError(t, err)
	r := NewReloader(running, func() (Config, error) { return next, nil }, Targets{Fleet: workers, Policy: policy}, nil, nil)

	_, err = r.Reload()
	require.ErrorContains(t, err, "queue_weight")
	assert.ErrorContains(t, err, "nothing was changed")
	assert.Equal(t, running.Router.Workers, workers.workers, "the refused file's workers were applied")
	assert.Equal(t, running.Policy.Params, policy.Params())
	assert.Equal(t, running, r.Running())
}
