package index

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBlockTableAgreesWithAMap runs seeded random inserts, updates and deletes against
// a blockTable and a Go map side by side: every hash the map holds is found with its
// value, every other is not, and the counts agree. Keys come from a small universe
// (with 0, which slots cannot hold) so runs collide, wrap around a shard's end and are
// shifted back by deletes; the mixing seed is fixed to 0 for some seeds so equal low
// bits stay equal.
func TestBlockTableAgreesWithAMap(t *testing.T) {
	for _, tc := range []struct {
		shardBits uint
		universe  uint64
	}{
		{0, 16}, {0, 200}, {2, 64}, {2, 5000}, {6, 20_000},
	} {
		for seed := range uint64(6) {
			t.Run(fmt.Sprintf("shards=%d/universe=%d/seed=%d", 1<<tc.shardBits, tc.universe, seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, tc.universe))
				mixSeed := uint64(0)
				if seed%2 == 1 {
					mixSeed = rng.Uint64()
				}
				table, want := newBlockTable(mixSeed, tc.shardBits), map[uint64]uint64{}
				key := func() uint64 {
					k := rng.Uint64N(tc.universe)
					if seed >= 4 {
						k <<= 40 // keys differing only in high bits
					}
					return k
				}
				for op := range 20_000 {
					k := key()
					switch r := rng.IntN(10); {
					case r < 5:
						v := rng.Uint64()
						*table.upsert(k) = v
						want[k] = v
					case r < 6:
						*table.upsert(k) |= 1
						want[k] |= 1
					default:
						_, held := want[k]
						require.Equal(t, held, table.delete(k), "op %d: delete(%d)", op, k)
						delete(want, k)
					}
					if op%1999 == 0 || op == 19_999 {
						requireSameContents(t, table, want, tc.universe)
					}
				}
				// Emptied, every shard gives back its memory.
				for k := range want {
					require.True(t, table.delete(k))
				}
				requireSameContents(t, table, map[uint64]uint64{}, tc.universe)
				for i, s := range table.shards {
					require.LessOrEqual(t, len(s.slots), minShardSlots, "shard %d kept %d slots", i, len(s.slots))
				}
			})
		}
	}
}

func requireSameContents(t *testing.T, table *blockTable, want map[uint64]uint64, universe uint64) {
	t.Helper()
	require.Equal(t, len(want), table.len())
	for k := range universe {
		for _, k := range []uint64{k, k << 40} {
			v, ok := table.find(k)
			w, held := want[k]
			require.Equal(t, held, ok, "find(%d)", k)
			require.Equal(t, w, v, "find(%d)", k)
		}
	}
	seen := map[uint64]uint64{}
	table.each(func(h, v uint64) { seen[h] = v })
	require.Equal(t, want, seen)
	for i, s := range table.shards {
		used := 0
		for _, slot := range s.slots {
			if slot.hash != 0 {
				used++
			}
		}
		require.Equal(t, s.count, used, "shard %d's count", i)
		require.LessOrEqual(t, 4*s.count, 3*max(len(s.slots), minShardSlots), "shard %d is over three quarters full", i)
	}
}

// TestUpsertOfAHeldHashDoesNotGrow: overwriting a hash the table holds adds nothing,
// so it must not resize a shard that is as full as it may be.
func TestUpsertOfAHeldHashDoesNotGrow(t *testing.T) {
	table := newBlockTable(0, 0)
	for h := uint64(1); h <= 6; h++ { // 6 of 8 slots: three quarters
		*table.upsert(h) = h
	}
	require.Len(t, table.shards[0].slots, minShardSlots)
	for h := uint64(1); h <= 6; h++ {
		*table.upsert(h) |= 1 << 8
	}
	require.Len(t, table.shards[0].slots, minShardSlots, "an update grew the shard")
	*table.upsert(7) = 7
	require.Len(t, table.shards[0].slots, 2*minShardSlots, "the seventh hash did not grow it")
	for h := uint64(1); h <= 7; h++ {
		want := h
		if h <= 6 {
			want |= 1 << 8
		}
		v, ok := table.find(h)
		require.True(t, ok)
		require.Equal(t, want, v)
	}
}

// each calls fn for every hash held and its value, in no particular order (for tests:
// nothing in the index walks a table). fn must not modify the table.
func (t *blockTable) each(fn func(hash, value uint64)) {
	if t.zeroHeld {
		fn(0, t.zeroValue)
	}
	for i := range t.shards {
		for _, slot := range t.shards[i].slots {
			if slot.hash != 0 {
				fn(slot.hash, slot.value)
			}
		}
	}
}
