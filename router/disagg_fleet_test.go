package router

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/scoring"
)

// With round_robin, the prefill pick must not advance the destinations' rotation:
// every request split, two decode and two prefill workers, both decode workers and
// both prefill workers take turns.
func TestRoundRobinRotatesDestinationsAndPrefillWorkersApart(t *testing.T) {
	f := newFixture(t, pdParams(0), pdWorkers()...)
	f.router.deps.Picker, f.router.deps.PrefillPicker = &scoring.RoundRobin{}, &scoring.RoundRobin{}
	dest, prefill := map[string]int{}, map[string]int{}
	for i := range 8 {
		d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(1000*i, 40)})
		require.NoError(t, err)
		require.NotNil(t, d.Prefill)
		dest[d.Worker]++
		prefill[d.Prefill.Worker]++
		d.Release()
	}
	assert.Equal(t, map[string]int{"decode-0": 4, "decode-1": 4}, dest)
	assert.Equal(t, map[string]int{"prefill-0": 4, "prefill-1": 4}, prefill)
}

// fleetChange plays a fleet change landing inside a decision, after its candidates
// were read and before it takes the decision lock (SetWorkers waits for a decision
// holding it): Signals is asked of each candidate in between. once runs at the first
// call.
type fleetChange struct{ once func() }

func (c *fleetChange) Signals(string) (int, float64) {
	if c.once != nil {
		c.once()
		c.once = nil
	}
	return 0, 0
}

// A prefill worker removed from the fleet between the candidate list and the booking
// leaves nothing in the ledger once the request ends.
func TestAPrefillWorkerRemovedMidDecisionLeavesNoLoadBehind(t *testing.T) {
	workers := []Worker{
		{Name: "decode-0", Address: "127.0.0.1:8001", Role: RoleDecode},
		{Name: "prefill-0", Address: "127.0.0.1:8101", Role: RolePrefill},
	}
	f := newFixture(t, pdParams(0), workers...)
	f.router.deps.Signals = &fleetChange{once: func() {
		// What fleet.Apply does, in its order.
		require.NoError(t, f.router.SetWorkers(workers[:1]))
		f.index.RemoveWorker("prefill-0")
		f.bookings.RemoveWorker("prefill-0")
	}}
	d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40)})
	require.NoError(t, err)
	require.NotNil(t, d.Prefill)
	d.FirstToken()
	d.Release()
	loads, _ := f.bookings.LoadsWithAdapters()
	assert.NotContains(t, loads, "prefill-0", "the departed prefill worker is forgotten")
}
