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
