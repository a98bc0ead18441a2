package scoring

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBookingsAgreeWithAModel interleaves Book, PrefillDone, Release, MoveTo and
// RemoveWorker at random and holds the ledger's P, D, N and W to a plain list of live
// bookings; at the end, with every booking released and every worker removed, the
// ledger must hold nothing.
func TestBookingsAgreeWithAModel(t *testing.T) {
	type mb struct {
		k        *Booking
		worker   string
		tokens   int
		blocks   []uint64
		done     bool
		released bool
	}
	workers := []string{"a", "b", "c"}
	for seed := uint64(0); seed < 300; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		now := time.Unix(1_700_000_000, 0)
		b := NewBookingsResident(time.Minute, func() time.Time { return now })
		var live []*mb
		for step := 0; step < 60; step++ {
			now = now.Add(time.Second)
			switch op := rng.IntN(5); {
			case op == 0 || len(live) == 0:
				w := workers[rng.IntN(len(workers))]
				n := rng.IntN(4)
				blocks := make([]uint64, n)
				for i := range blocks {
					blocks[i] = uint64(rng.IntN(5) + 1)
				}
				tok := rng.IntN(100)
				lora := []string{"", "x", "y"}[rng.IntN(3)]
				live = append(live, &mb{k: b.BookAdapter(w, lora, blocks, tok), worker: w, tokens: tok, blocks: blocks})
			case op == 1:
				m := live[rng.IntN(len(live))]
				m.k.PrefillDone()
				if !m.released {
					m.done = true
				}
			case op == 2:
				m := live[rng.IntN(len(live))]
				got := m.k.Release()
				require.Equal(t, !m.released, got)
				m.released = true
			case op == 3:
				m := live[rng.IntN(len(live))]
				w := workers[rng.IntN(len(workers))]
				tok := rng.IntN(100)
				moved := m.k.MoveTo(w, tok)
				require.Equal(t, !m.released && w != m.worker, moved)
				if moved {
					m.worker, m.tokens = w, tok
				}
			case op == 4:
				b.RemoveWorker(workers[rng.IntN(len(workers))])
			}
			for _, w := range workers {
				var want Load
				blocks := map[uint64]bool{}
				for _, m := range live {
					if m.released || m.worker != w {
						continue
					}
					want.ActiveRequests++
					if !m.done {
						want.PrefillTokens += m.tokens
						want.PendingRequests++
					}
					for _, h := range m.blocks {
						blocks[h] = true
					}
				}
				want.ActiveBlocks = len(blocks)
				require.Equal(t, want, b.Load(w), fmt.Sprintf("seed %d step %d worker %s", seed, step, w))
			}
		}
		for _, m := range live {
			m.k.Release()
		}
		for _, w := range workers {
			b.RemoveWorker(w)
		}
		loads, adapters := b.LoadsWithAdapters()
		require.Empty(t, loads, "seed %d", seed)
		require.Empty(t, adapters, "seed %d", seed)
	}
}
