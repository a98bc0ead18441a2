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
	"github.com/kvroute/kvroute/tokenize"
)

// TestPrefillHistorySendsAColdPromptFromTheWorkerThatComputedMost pins
// prefill_history_weight through Route. Worker a computed a cold 400-token prompt
// (100 blocks of 4) and finished it; b runs one 40-token request. A cold 40-token
// prompt costs 20 on a (prefill 10 + new 10) and 30 on b (its 10 active blocks more),
// so it goes to a; ω = 1 charges a's history, 100 blocks, against b's 10, until it has
// decayed, and it goes to b. The history decays with the ledger's clock.
func TestPrefillHistorySendsAColdPromptFromTheWorkerThatComputedMost(t *testing.T) {
	params := func(weight, halfLife float64) scoring.Params {
		p := scoring.DynamoParams()
		p.PrefillHistoryWeight, p.PrefillHistoryHalfLife = weight, halfLife
		return p
	}
	off, on := params(0, 30), params(1, 30)
	forgotten := params(1, 0)
	tests := []struct {
		name     string
		policy   scoring.Params
		override *scoring.Params // the route's
		elapsed  time.Duration   // since a's prompt was booked
		want     string
		history  float64 // a's charge in the decision's terms: ω·H(a)/bs
	}{
		{"off (the default): the idle worker", off, nil, 0, "a", 0},
		{"on: the worker that computed less", on, nil, 0, "b", 100},
		{"on, one half-life later: a's 50 blocks still outweigh b's 10 more", on, nil, 30 * time.Second, "b", 50},
		{"on, ten half-lives later: decayed", on, nil, 300 * time.Second, "a", 100.0 / 1024},
		{"off, on by a route's override", off, &on, 0, "b", 100},
		{"on, off by a route's override", on, &off, 0, "a", 0},
		{"on with a half-life of 0: nothing remembered", forgotten, nil, 0, "a", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Unix(1_000_000, 0)
			r, _, workers := historyRouter(t, tt.policy, func() time.Time { return now })
			ctx := context.Background()

			computed, err := r.Route(ctx, &Request{Model: "m", Tokens: tokens(0, 400), Subset: []string{workers[0].Address}})
			require.NoError(t, err)
			require.Equal(t, "a", computed.Worker)
			computed.FirstToken()
			computed.Release()
			running, err := r.Route(ctx, &Request{Model: "m", Tokens: tokens(10_000, 40), Subset: []string{workers[1].Address}})
			require.NoError(t, err)
			require.Equal(t, "b", running.Worker)
			running.FirstToken()
			t.Cleanup(func() { running.Release() })

			now = now.Add(tt.elapsed)
			d, err := r.Route(ctx, &Request{Model: "m", Tokens: tokens(20_000, 40), Params: tt.override})
			require.NoError(t, err)
			defer d.Release()
			assert.Equal(t, tt.want, d.Worker)
			assertHistoryCharge(t, d, "a", tt.history)
		})
	}
}

// TestAWorkerAnotherReplicaComputedOnIsChargedHere: the prefill history other replicas
// report (package peers, through Bookings.SetPeerHistory) is charged by
// prefill_history_weight as this replica's own is. This replica booked nothing on a
// and one 40-token request on b, so a cold prompt goes to a; another replica's 400
// tokens on a (100 blocks of 4) send it to b while they last, and the decision's terms
// show them in a's H.
func TestAWorkerAnotherReplicaComputedOnIsChargedHere(t *testing.T) {
	tests := []struct {
		name    string
		weight  float64
		elapsed time.Duration // since the peers' history was given
		want    string
		history float64 // a's charge in the decision's terms: ω·H(a)/bs
	}{
		{"off (the default): the idle worker", 0, 0, "a", 0},
		{"on: the worker another replica computed on is charged", 1, 0, "b", 100},
		{"on, one half-life later: still", 1, 30 * time.Second, "b", 50},
		{"on, ten half-lives later: decayed", 1, 300 * time.Second, "a", 100.0 / 1024},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Unix(1_000_000, 0)
			p := scoring.DynamoParams()
			p.PrefillHistoryWeight = tt.weight
			r, bookings, workers := historyRouter(t, p, func() time.Time { return now })
			ctx := context.Background()

			running, err := r.Route(ctx, &Request{Model: "m", Tokens: tokens(10_000, 40), Subset: []string{workers[1].Address}})
			require.NoError(t, err)
			require.Equal(t, "b", running.Worker)
			running.FirstToken()
			t.Cleanup(func() { running.Release() })
			bookings.SetPeerHistory("a", 400)

			now = now.Add(tt.elapsed)
			d, err := r.Route(ctx, &Request{Model: "m", Tokens: tokens(20_000, 40)})
			require.NoError(t, err)
			defer d.Release()
			assert.Equal(t, tt.want, d.Worker)
			assertHistoryCharge(t, d, "a", tt.history)
		})
	}
}

// historyRouter is a router over twoWorkers with the given policy, recording its
// decisions, whose ledger and decisions read clock.
func historyRouter(t *testing.T, params scoring.Params, clock func() time.Time) (*Router, *scoring.Bookings, []Worker) {
	t.Helper()
	workers := twoWorkers()
	idx, err := index.New(index.Config{CapacityBlocks: 1000}, nil)
	require.NoError(t, err)
	for _, w := range workers {
		require.NoError(t, idx.SetWorker(w.Name, w.CapacityBlocks))
	}
	policy, err := scoring.NewPolicy(params)
	require.NoError(t, err)
	bookings := scoring.NewBookingsResident(0, clock)
	r, err := New(Config{BlockSize: 4, Workers: workers}, Deps{
		Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}, Index: idx,
		Bookings: bookings, Picker: scoring.NewKVCostWithPolicy(policy, rand.New(rand.NewPCG(1, 1))),
		RecordBlocks: true, Policy: policy, Now: clock,
	})
	require.NoError(t, err)
	return r, bookings, workers
}

// assertHistoryCharge checks the prefill-history charge the decision's terms show for
// worker.
func assertHistoryCharge(t *testing.T, d *Decision, worker string, want float64) {
	t.Helper()
	for _, term := range d.Terms {
		if term.Worker == worker {
			assert.InDelta(t, want, term.History, 1e-9, "the decision's terms show the charge")
		}
	}
}
