package router

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/session"
	"github.com/kvroute/kvroute/tokenize"
)

// threeWorkers is twoWorkers and a third.
func threeWorkers() []Worker {
	return append(twoWorkers(), Worker{Name: "c", Address: "127.0.0.1:8003"})
}

// The session a fallback served is remembered there: its next turn is credited to the
// worker that holds it, not to the one the data plane could not reach.
func TestServedRemembersTheSessionOnTheFallback(t *testing.T) {
	f := newFixture(t, scoring.DynamoParams(), twoWorkers()...)
	store, err := session.New(session.Config{TTL: time.Hour, MaxEntries: 10}, nil)
	require.NoError(t, err)
	f.router.deps.Sessions = store
	d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40), Session: "s1"})
	require.NoError(t, err)
	defer d.Release()
	last, _ := store.Lookup("s1")
	require.Equal(t, d.Worker, last)

	worker, moved, err := d.Served(d.FallbackAddresses[0])
	require.NoError(t, err)
	require.True(t, moved)
	last, _ = store.Lookup("s1")
	assert.Equal(t, worker, last)
	assert.NotEqual(t, d.Worker, last)
}

// A request moves once: a later report, even of another fallback, moves nothing (the
// data plane reports the one endpoint that served).
func TestServedMovesOnceEvenToAnotherFallback(t *testing.T) {
	f := newFixture(t, scoring.DynamoParams(), threeWorkers()...)
	d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40)})
	require.NoError(t, err)
	defer d.Release()
	require.Len(t, d.FallbackAddresses, 2)
	first, moved, err := d.Served(d.FallbackAddresses[0])
	require.NoError(t, err)
	require.True(t, moved)
	_, moved, err = d.Served(d.FallbackAddresses[1])
	require.NoError(t, err)
	assert.False(t, moved)
	assert.Equal(t, first, d.ServedWorker())
	for _, w := range threeWorkers() {
		want := 0
		if w.Name == first {
			want = 1
		}
		assert.Equal(t, want, f.bookings.Load(w.Name).ActiveRequests, w.Name)
	}
}

// A chosen worker a reload took out of the index holds nothing to forget: the request
// still moves, without an error.
func TestServedMovesOffAChosenWorkerTheIndexNoLongerKnows(t *testing.T) {
	f := newFixture(t, scoring.DynamoParams(), twoWorkers()...)
	d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40)})
	require.NoError(t, err)
	defer d.Release()
	f.index.RemoveWorker(d.Worker)
	worker, moved, err := d.Served(d.FallbackAddresses[0])
	assert.NoError(t, err)
	assert.True(t, moved)
	assert.Equal(t, 10, f.index.WorkerEntries(worker), "the fallback's blocks are recorded")
}

// A split request's destination computes nothing (its prefill worker does and sends the
// KV): moved to another decode worker, it books no prefill there either.
func TestServedASplitRequestBooksNoPrefillOnTheFallback(t *testing.T) {
	f := newFixture(t, pdParams(0), pdWorkers()...)
	d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40)})
	require.NoError(t, err)
	defer d.Release()
	require.NotNil(t, d.Prefill)
	worker, moved, err := d.Served(d.FallbackAddresses[0])
	require.NoError(t, err)
	require.True(t, moved)
	assert.Equal(t, scoring.Load{ActiveBlocks: 10, ActiveRequests: 1, PendingRequests: 1}, f.bookings.Load(worker), "the fallback computes nothing")
	assert.Equal(t, scoring.Load{PrefillTokens: 40, ActiveBlocks: 10, ActiveRequests: 1, PendingRequests: 1}, f.bookings.Load(d.Prefill.Worker),
		"the prefill worker's part stays")
}

// The fallback's booked prefill is what it computes, as Route books a destination's: a
// run its engine holds in host memory counts at its load credit.
func TestServedBooksTheFallbacksPrefillAtItsLoadCredit(t *testing.T) {
	prompt := tokens(0, 40)
	hashes := index.BlockHashes(nil, prompt, 4, index.Salt("m", "", ""))
	// a holds 2 blocks on device and the rest of the prompt's 10 in host memory, but is
	// busy: b is chosen, a is the fallback.
	idx, workers := offloadedOnA(t, hashes)
	params := scoring.DefaultParams()
	params.OffloadCredit = 0.9
	params.ActiveRequestWeight = 8
	policy, err := scoring.NewPolicy(params)
	require.NoError(t, err)
	bookings := scoring.NewBookings()
	for range 20 {
		bookings.Book("a", nil, 0).PrefillDone()
	}
	r, err := New(Config{BlockSize: 4, Workers: workers}, Deps{
		Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{},
		Index: idx, Bookings: bookings, Picker: scoring.NewKVCostWithPolicy(policy, rand.New(rand.NewPCG(1, 1))), RecordBlocks: true, Policy: policy,
	})
	require.NoError(t, err)
	d, err := r.Route(context.Background(), &Request{Model: "m", Tokens: prompt})
	require.NoError(t, err)
	defer d.Release()
	require.Equal(t, "b", d.Worker)
	before := bookings.Load("a").PrefillTokens
	worker, moved, err := d.Served(d.FallbackAddresses[0])
	require.NoError(t, err)
	require.True(t, moved)
	require.Equal(t, "a", worker)
	assert.Equal(t, 40-2*4-29, bookings.Load("a").PrefillTokens-before, "0.9 × 32 loaded tokens, rounded, are not computed")
}

// A worker that left the fleet leaves the ledger once nothing booked there runs: the
// booking moving off a removed chosen worker, or onto a removed fallback and released
// there, leaves no entry of it (peers would hear of it for good).
func TestServedLeavesNoRemovedWorkerInTheLedger(t *testing.T) {
	tests := []struct {
		name    string
		removed func(d *Decision) string
	}{
		{"the chosen worker removed", func(d *Decision) string { return d.Worker }},
		{"the fallback removed", func(d *Decision) string { return d.Terms[d.Fallbacks[0]].Worker }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, scoring.DynamoParams(), twoWorkers()...)
			d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40)})
			require.NoError(t, err)
			gone := tt.removed(d)
			f.index.RemoveWorker(gone) // as fleet.Apply does: the index, then the ledger
			f.bookings.RemoveWorker(gone)
			_, moved, err := d.Served(d.FallbackAddresses[0])
			require.NoError(t, err)
			require.True(t, moved)
			require.True(t, d.Release())
			loads, _ := f.bookings.LoadsWithAdapters()
			assert.NotContains(t, loads, gone)
		})
	}
}

// TestARefusedRequestLeavesNoBlocksItsWorkerNeverComputed: an engine that answers a
// 4xx or 5xx (a prompt past its context, a busy engine) never computed the prompt.
// Its blocks beyond what the worker held before stay recorded no longer (a hostile
// 1 M-token prompt's 65,536 blocks evicted an approximate index's real content), the
// blocks it held before stay, and so does everything after a second call. The blocks
// of a request moved to a fallback are forgotten on the fallback.
func TestARefusedRequestLeavesNoBlocksItsWorkerNeverComputed(t *testing.T) {
	t.Run("on the chosen worker", func(t *testing.T) {
		f := newFixture(t, scoring.DynamoParams(), twoWorkers()...)
		first, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40)})
		require.NoError(t, err)
		first.Release()
		d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 80)})
		require.NoError(t, err)
		defer d.Release()
		require.Equal(t, first.Worker, d.Worker, "the longer prompt goes where its first half is")
		require.Equal(t, 20, f.index.WorkerEntries(d.Worker))
		require.NoError(t, d.Refused())
		assert.Equal(t, 10, f.index.WorkerEntries(d.Worker), "only the blocks held before the refused request stay")
		require.NoError(t, d.Refused())
		assert.Equal(t, 10, f.index.WorkerEntries(d.Worker))
	})
	t.Run("on the fallback that served it", func(t *testing.T) {
		f := newFixture(t, scoring.DynamoParams(), twoWorkers()...)
		d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40)})
		require.NoError(t, err)
		defer d.Release()
		worker, moved, err := d.Served(d.FallbackAddresses[0])
		require.NoError(t, err)
		require.True(t, moved)
		require.Equal(t, 10, f.index.WorkerEntries(worker))
		require.NoError(t, d.Refused())
		assert.Zero(t, f.index.WorkerEntries(worker))
		assert.Zero(t, f.index.WorkerEntries(d.Worker))
	})
}
