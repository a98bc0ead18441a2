package kvevents

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
)

// TestDeviceAndHostBlocksFollowTheirOwnEvents applies random single-block events on
// two data-parallel ranks, each reporting a device (GPU) and a host (CPU) tier, and
// checks after every batch that the index holds exactly what a plain model of the
// engine's four sources says: on device, the blocks some GPU source maps an engine
// hash to; offloaded, those of some CPU source. Token contents come from a small
// alphabet so that engine hashes of different sources (and reused engine hashes) map
// to the same block: a block's reference counts must stay per tier.
func TestDeviceAndHostBlocksFollowTheirOwnEvents(t *testing.T) {
	type source struct {
		rank   int
		medium string
	}
	sources := []source{{0, "GPU"}, {0, "CPU"}, {1, "GPU"}, {1, "CPU"}}
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		h := newHarness(t, 2, nil)
		salt := index.Salt(testModel, "", "")
		model := map[source]map[uint64]uint64{} // engine hash → own hash, per source
		for _, s := range sources {
			model[s] = map[uint64]uint64{}
		}
		ownOf := map[uint64][]uint32{} // own hash → its tokens, to ask the index
		for step := range 400 {
			s := sources[rng.IntN(len(sources))]
			engine := uint64(rng.IntN(40) + 1)
			var ev Event
			switch r := rng.IntN(10); {
			case r < 6: // store (possibly reusing an engine hash for other tokens)
				tokens := toks(rng.IntN(12)*testBS, testBS)
				ev = stored([]uint64{engine}, 0, tokens)
				own := index.BlockHashes(nil, tokens, testBS, salt)[0]
				model[s][engine], ownOf[own] = own, tokens
			case r < 9:
				ev = removed(engine)
				delete(model[s], engine)
			default:
				if rng.IntN(4) > 0 {
					continue
				}
				ev = Event{Type: TypeAllBlocksCleared}
				for _, other := range sources {
					if other.rank == s.rank {
						model[other] = map[uint64]uint64{}
					}
				}
			}
			ev.Medium = s.medium
			h.apply(s.rank, ev)

			want := map[string]map[uint64]bool{"GPU": {}, "CPU": {}}
			for src, m := range model {
				for _, own := range m {
					want[src.medium][own] = true
				}
			}
			require.Equal(t, len(want["GPU"]), h.idx.ConfirmedEntries("w"), "seed %d step %d: device blocks", seed, step)
			require.Equal(t, len(want["CPU"]), h.idx.OffloadedEntries("w"), "seed %d step %d: host blocks", seed, step)
			for own, tokens := range ownOf {
				device, run := h.offloaded(tokens)
				require.Equal(t, want["GPU"][own], device == 1, "seed %d step %d: block %x on device", seed, step, own)
				if device == 0 {
					require.Equal(t, want["CPU"][own], run == 1, "seed %d step %d: block %x on the host", seed, step, own)
				}
			}
		}
	}
}
