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

// TestARunOffloadedToHostMemoryIsPricedAndNotBookedAsPrefill routes a 40-token prompt
// (10 blocks of 4) between a worker whose engine offloaded 8 of its blocks to host
// memory (evicted from the device, reported in its offload tier) and an empty one
// lighter by two requests. What the offloaded run is worth decides the pick, and the
// chosen worker is booked only the prefill it computes.
func TestARunOffloadedToHostMemoryIsPricedAndNotBookedAsPrefill(t *testing.T) {
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
		{"credit 0.9: loading beats recomputing", 0.9, "a", 8, 40 - 2*4 - 8*4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			idx, err := index.NewEventIndex(index.Config{CapacityBlocks: 100, PendingTTL: time.Second}, nil)
			require.NoError(t, err)
			workers := twoWorkers()
			for _, w := range workers {
				require.NoError(t, idx.SetWorker(w.Name, 0))
				require.NoError(t, idx.SetMode(w.Name, index.ModeEvents))
			}
			require.NoError(t, idx.BlockStored("a", hashes[:2]))
			require.NoError(t, idx.OffloadStored("a", hashes[:10]))

			params := scoring.DefaultParams()
			params.OffloadCredit = tt.credit
			params.ActiveRequestWeight = 8
			picker, err := scoring.NewKVCost(params, rand.New(rand.NewPCG(1, 1)))
			require.NoError(t, err)
			bookings := scoring.NewBookings()
			for range 2 {
				bookings.Book("a", nil, 0).PrefillDone() // two requests decoding on a
			}
			r, err := New(Config{BlockSize: 4, Workers: workers}, Deps{
				Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{},
				Index: idx, Bookings: bookings, Picker: picker, RecordBlocks: true,
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
			assert.Equal(t, tt.wantP, bookings.Load(d.Worker).PrefillTokens, "loaded tokens are not booked as prefill")
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
