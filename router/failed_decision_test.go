package router

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/kvroute/kvroute/scoring"
)

// TestAFailedDecisionLeavesNothingBehind: a decision that fails after booking (here
// the record sink panics, which server.Recovery turns into that stream's error: no
// worker is sent the request) released its bookings, but what it had put in the
// index and in the prefill history stayed: the worker was credited with blocks nobody
// computes, and charged ω for a prefill that never runs. Its bookings are now cancelled
// and its recorded blocks forgotten.
func TestAFailedDecisionLeavesNothingBehind(t *testing.T) {
	f := newFixture(t, scoring.DynamoParams(), twoWorkers()...)
	f.router.deps.Records = &panicky{}
	assert.Panics(t, func() { _, _ = f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40)}) })
	for _, w := range twoWorkers() {
		assert.Equal(t, scoring.Load{}, f.bookings.Load(w.Name))
		assert.Zero(t, f.index.WorkerEntries(w.Name), "%s: the failed decision's blocks are recorded", w.Name)
		assert.Zero(t, f.bookings.PrefillHistory(w.Name, 30), "%s: the failed decision's prefill is in the history", w.Name)
	}
}
