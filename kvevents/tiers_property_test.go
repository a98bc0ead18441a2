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
//
// With hostBlocks 2 the host tier stores chunks of two blocks (LMCache's form): each
// engine hash then maps to two blocks, and the index's counts must follow both.
func TestDeviceAndHostBlocksFollowTheirOwnEvents(t *testing.T) {
	for _, hostBlocks := range []int{1, 2} {
		testDeviceAndHostBlocks(t, hostBlocks)
	}
}

func testDeviceAndHostBlocks(t *testing.T, hostBlocks int) {
	type source struct {
		rank   int
		medium string
	}
	sources := []source{{0, "GPU"}, {0, "CPU"}, {1, "GPU"}, {1, "CPU"}}
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		h := newHarness(t, 2, nil)
		salt := index.Salt(testModel, "", "")
		model := map[source]map[uint64][]uint64{} // engine hash → own hashes, per source
		for _, s := range sources {
			model[s] = map[uint64][]uint64{}
		}
		ownOf := map[uint64][]uint32{} // own hash → its tokens, to ask the index
		for step := range 400 {
			s := sources[rng.IntN(len(sources))]
			engine := uint64(rng.IntN(40) + 1)
			var ev Event
			switch r := rng.IntN(10); {
			case r < 6: // store (possibly reusing an engine hash for other tokens)
				n := 1
				if s.medium == "CPU" {
					n = hostBlocks
				}
				tokens := toks(rng.IntN(12)*testBS, n*testBS)
				ev = stored([]uint64{engine}, 0, tokens)
				ev.BlockSize = n * testBS
				own := index.BlockHashes(nil, tokens, testBS, salt)
				model[s][engine] = own
				if n == 1 {
					ownOf[own[0]] = tokens
				}
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
						model[other] = map[uint64][]uint64{}
					}
				}
			}
			ev.Medium = s.medium
			h.apply(s.rank, ev)

			want := map[string]map[uint64]bool{"GPU": {}, "CPU": {}}
			for src, m := range model {
				for _, own := range m {
					for _, o := range own {
						want[src.medium][o] = true
					}
				}
			}
			require.Equal(t, len(want["GPU"]), h.idx.ConfirmedEntries("w"), "host chunks of %d: seed %d step %d: device blocks", hostBlocks, seed, step)
			require.Equal(t, len(want["CPU"]), h.idx.OffloadedEntries("w"), "host chunks of %d: seed %d step %d: host blocks", hostBlocks, seed, step)
			for own, tokens := range ownOf {
				device, run := h.offloaded(tokens)
				require.Equal(t, want["GPU"][own], device == 1, "seed %d step %d: block %x on device", seed, step, own)
				if device == 0 && hostBlocks == 1 { // a one-block prompt loads no chunk of two
					require.Equal(t, want["CPU"][own], run == 1, "seed %d step %d: block %x on the host", seed, step, own)
				}
			}
		}
	}
}
