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

// TestARunOffloadedToHostMemoryIsPricedAndBookedAtItsCredit routes a 40-token prompt
// (10 blocks of 4) between a worker whose engine offloaded 8 of its blocks to host
// memory (evicted from the device, reported in its offload tier) and an empty one
// lighter by two requests. What the offloaded run is worth decides the pick, and the
// chosen worker's booked prefill counts a loaded token as the cost does: 1 − u of a
// computed one (u = 0: DESIGN's P, isl − ov·bs).
func TestARunOffloadedToHostMemoryIsPricedAndBookedAtItsCredit(t *testing.T) {
	prompt := tokens(0, 40)
	hashes := index.BlockHashes(nil, prompt, 4, index.Salt("m", "", ""))
	tests := []struct {
		name       string
		credit     float64
		want       string
		wantLoaded int // the chosen candidate's offloaded blocks
		wantP      int // P booked on the chosen worker
	}{
		{"credit 0: the run is a miss and the empty worker wins", 0, "b", 0, 40},
		{"credit 0.9: loading beats recomputing", 0.9, "a", 8, 40 - 2*4 - 29}, // 0.9 × 32 loaded tokens, rounded
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			idx, workers := offloadedOnA(t, hashes)

			params := scoring.DefaultParams()
			params.OffloadCredit = tt.credit
			params.ActiveRequestWeight = 8
			policy, err := scoring.NewPolicy(params)
			require.NoError(t, err)
			picker := scoring.NewKVCostWithPolicy(policy, rand.New(rand.NewPCG(1, 1)))
			bookings := scoring.NewBookings()
			for range 2 {
				bookings.Book("a", nil, 0).PrefillDone() // two requests decoding on a
			}
			r, err := New(Config{BlockSize: 4, Workers: workers}, Deps{
				Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{},
				Index: idx, Bookings: bookings, Picker: picker, RecordBlocks: true, Policy: policy,
			})
			require.NoError(t, err)

			d, err := r.Route(context.Background(), &Request{Model: "m", Tokens: prompt})
			require.NoError(t, err)
			defer d.Release()
			byWorker := map[string]scoring.Terms{}
			for _, term := range d.Terms {
				byWorker[term.Worker] = term
			}
			assert.Equal(t, [2]int{2, 8}, [2]int{byWorker["a"].Overlap, byWorker["a"].OffloadedBlocks},
				"the host run continues the device run")
			assert.Zero(t, byWorker["b"].OffloadedBlocks)
			require.Equal(t, tt.want, d.Worker)
			assert.Equal(t, tt.wantLoaded, d.Terms[d.Chosen].OffloadedBlocks)
			assert.Equal(t, tt.wantP, bookings.Load(d.Worker).PrefillTokens, "loaded tokens are booked at 1 − u")
			assert.Equal(t, d.Terms[d.Chosen].Overlap*4, d.PredictedCachedTokens, "the prediction counts device hits only")
		})
	}
}

func TestAnIndexWithoutOffloadTiersReportsNoOffloadedBlocks(t *testing.T) {
	f := newFixture(t, scoring.DefaultParams(), twoWorkers()...)
	d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40)})
	require.NoError(t, err)
	defer d.Release()
	for _, term := range d.Terms {
		assert.Zero(t, term.OffloadedBlocks, term.Worker)
	}
}

// TestDynamosCostBooksDesignsPrefill: with offload_credit 0 (the kv baseline) a worker
// whose prompt is on its host is booked isl − ov·bs, as DESIGN §3 defines P, whatever
// it will load.
func TestDynamosCostBooksDesignsPrefill(t *testing.T) {
	prompt := tokens(0, 40)
	hashes := index.BlockHashes(nil, prompt, 4, index.Salt("m", "", ""))
	idx, err := index.NewEventIndex(index.Config{CapacityBlocks: 100, PendingTTL: time.Second}, nil)
	require.NoError(t, err)
	require.NoError(t, idx.SetWorker("a", 0))
	require.NoError(t, idx.SetMode("a", index.ModeEvents))
	require.NoError(t, idx.BlockStored("a", hashes[:2]))
	require.NoError(t, idx.OffloadStored("a", hashes[:10]))
	policy, err := scoring.NewPolicy(scoring.DynamoParams())
	require.NoError(t, err)
	bookings := scoring.NewBookings()
	r, err := New(Config{BlockSize: 4, Workers: twoWorkers()[:1]}, Deps{Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{},
		Index: idx, Bookings: bookings, Picker: scoring.NewKVCostWithPolicy(policy, rand.New(rand.NewPCG(1, 1))), RecordBlocks: true, Policy: policy})
	require.NoError(t, err)
	d, err := r.Route(context.Background(), &Request{Model: "m", Tokens: prompt})
	require.NoError(t, err)
	defer d.Release()
	assert.Equal(t, 8, d.Terms[d.Chosen].OffloadedBlocks)
	assert.Equal(t, 32, bookings.Load("a").PrefillTokens)
}

// TestTheDecodeWorkersHostRunIsNotSentToAPrefillWorker: a decode worker holding 8
// tokens of a 40-token prompt on device and the other 32 in host memory misses none of
// it: with disaggregate_tokens 16 no prefill worker recomputes the prompt to send it
// over the network.
func TestTheDecodeWorkersHostRunIsNotSentToAPrefillWorker(t *testing.T) {
	prompt := tokens(0, 40)
	hashes := index.BlockHashes(nil, prompt, 4, index.Salt("m", "", ""))
	idx, err := index.NewEventIndex(index.Config{CapacityBlocks: 100, PendingTTL: time.Second}, nil)
	require.NoError(t, err)
	for _, w := range pdWorkers() {
		require.NoError(t, idx.SetWorker(w.Name, 0))
		require.NoError(t, idx.SetMode(w.Name, index.ModeEvents))
	}
	require.NoError(t, idx.BlockStored("decode-1", hashes[:2]))
	require.NoError(t, idx.OffloadStored("decode-1", hashes[:10]))
	policy, err := scoring.NewPolicy(pdParams(16))
	require.NoError(t, err)
	r, err := New(Config{BlockSize: 4, Workers: pdWorkers()}, Deps{Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{},
		Index: idx, Bookings: scoring.NewBookings(), Picker: scoring.NewKVCostWithPolicy(policy, rand.New(rand.NewPCG(1, 1))),
		RecordBlocks: true, Policy: policy})
	require.NoError(t, err)
	d, err := r.Route(context.Background(), &Request{Model: "m", Tokens: prompt})
	require.NoError(t, err)
	defer d.Release()
	require.Equal(t, "decode-1", d.Worker)
	assert.Nil(t, d.Prefill, "loading from host beats a prefill hop")
	assert.Equal(t, 0, d.MissingTokens)
}

// offloadedOnA returns an event index of twoWorkers in which a's engine holds the first
// 2 of hashes on its device and the first 10 in host memory, b nothing.
func offloadedOnA(t *testing.T, hashes []uint64) (*index.EventIndex, []Worker) {
	t.Helper()
	idx, err := index.NewEventIndex(index.Config{CapacityBlocks: 100, PendingTTL: time.Second}, nil)
	require.NoError(t, err)
	workers := twoWorkers()
	for _, w := range workers {
		require.NoError(t, idx.SetWorker(w.Name, 0))
		require.NoError(t, idx.SetMode(w.Name, index.ModeEvents))
	}
	require.NoError(t, idx.BlockStored("a", hashes[:2]))
	require.NoError(t, idx.OffloadStored("a", hashes[:10]))
	return idx, workers
}
