package index

import "math/bits"

// blockTable maps block hashes to uint64 values (a bitmask of workers, or a slab index).
// It replaces a Go map on the decision's hottest path: a lookup in a Go map of a million
// entries walks a directory, a table header and a group, each a likely cache miss once
// the index outgrows the caches; here a lookup reads one slot run of a flat array.
//
// Open addressing with linear probing, split into shards chosen by the top bits of the
// mixed hash, each growing (and shrinking) on its own: a resize rehashes one shard, so
// its pause stays short however large the index grows. The hashes are mixed with a
// seed chosen per table, so prompts crafted to collide in the slots cannot be made
// ahead of time. Not safe for concurrent use; lookups do not modify it, so concurrent
// lookups under a read lock are.
type blockTable struct {
	seed   uint64
	shift  uint // 64 − log2(len(shards)): the mixed hash's top bits pick the shard
	shards []tableShard
	count  int
	// Slots mark themselves empty with hash 0, so the hash 0 (which XXH3 can produce)
	// is kept aside.
	zeroHeld  bool
	zeroValue uint64
}

type tableShard struct {
	slots []tableSlot // a power of two long, or empty before the first insert
	count int
}

type tableSlot struct {
	hash, value uint64 // hash 0: empty
}

// minShardSlots is a shard's length after its first insert.
const minShardSlots = 8

// newBlockTable returns an empty table whose hashes are mixed with seed, in 2^shardBits
// shards.
func newBlockTable(seed uint64, shardBits uint) *blockTable {
	return &blockTable{seed: seed, shift: 64 - shardBits, shards: make([]tableShard, 1<<shardBits)}
}

// mix spreads every bit of a hash over every bit of the result (murmur3's finalizer),
// so both the top bits (the shard) and the low bits (the slot) are uniform.
func (t *blockTable) mix(hash uint64) uint64 {
	h := hash ^ t.seed
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// shard returns the shard of a mixed hash (with one shard, a shift by 64 is 0).
func (t *blockTable) shard(mixed uint64) *tableShard { return &t.shards[mixed>>t.shift] }

// len returns the number of hashes held.
func (t *blockTable) len() int { return t.count }

// find returns the value held for hash.
func (t *blockTable) find(hash uint64) (uint64, bool) {
	if hash == 0 {
		return t.zeroValue, t.zeroHeld
	}
	mixed := t.mix(hash)
	s := t.shard(mixed)
	if len(s.slots) == 0 {
		return 0, false
	}
	mask := uint64(len(s.slots) - 1)
	for i := mixed & mask; ; i = (i + 1) & mask {
		switch s.slots[i].hash {
		case hash:
			return s.slots[i].value, true
		case 0:
			return 0, false
		}
	}
}

// peek reads the first slot a lookup of hash would read, and returns a value only so
// the load is not optimised away: a caller about to look up many hashes that are
// likely out of cache peeks at all of them first, so their misses overlap instead of
// following one another.
func (t *blockTable) peek(hash uint64) uint64 {
	mixed := t.mix(hash)
	s := t.shard(mixed)
	if len(s.slots) == 0 {
		return 0
	}
	return s.slots[mixed&uint64(len(s.slots)-1)].hash
}

// upsert returns a pointer to hash's value, inserting the hash with value 0 if absent.
// The pointer is valid until the table's next upsert or delete.
func (t *blockTable) upsert(hash uint64) *uint64 {
	if hash == 0 {
		if !t.zeroHeld {
			t.zeroHeld, t.zeroValue = true, 0
			t.count++
		}
		return &t.zeroValue
	}
	mixed := t.mix(hash)
	s := t.shard(mixed)
	if len(s.slots) > 0 {
		mask := uint64(len(s.slots) - 1)
		i := mixed & mask
		for ; s.slots[i].hash != 0; i = (i + 1) & mask {
			if s.slots[i].hash == hash {
				return &s.slots[i].value
			}
		}
		// Absent: it goes in slot i, unless that would make the shard more than three
		// quarters full (which keeps a miss's probe run a few slots long).
		if 4*(s.count+1) <= 3*len(s.slots) {
			return t.insertAt(s, i, hash)
		}
	}
	t.resize(s, max(minShardSlots, 2*len(s.slots)))
	mask := uint64(len(s.slots) - 1)
	i := mixed & mask
	for s.slots[i].hash != 0 {
		i = (i + 1) & mask
	}
	return t.insertAt(s, i, hash)
}

// insertAt puts hash, with value 0, in the empty slot i of shard s.
func (t *blockTable) insertAt(s *tableShard, i uint64, hash uint64) *uint64 {
	s.slots[i] = tableSlot{hash: hash}
	s.count++
	t.count++
	return &s.slots[i].value
}

// delete removes hash and reports whether it was held.
func (t *blockTable) delete(hash uint64) bool {
	if hash == 0 {
		held := t.zeroHeld
		if held {
			t.zeroHeld, t.zeroValue = false, 0
			t.count--
		}
		return held
	}
	mixed := t.mix(hash)
	s := t.shard(mixed)
	if len(s.slots) == 0 {
		return false
	}
	mask := uint64(len(s.slots) - 1)
	i := mixed & mask
	for ; s.slots[i].hash != hash; i = (i + 1) & mask {
		if s.slots[i].hash == 0 {
			return false
		}
	}
	// Backward-shift deletion: move later entries of the run back over the hole when
	// their home slot does not lie between the hole and them, so no probe run is ever
	// broken and no tombstone is left behind.
	for j := i; ; {
		j = (j + 1) & mask
		if s.slots[j].hash == 0 {
			break
		}
		home := t.mix(s.slots[j].hash) & mask
		if (j-home)&mask >= (j-i)&mask {
			s.slots[i] = s.slots[j]
			i = j
		}
	}
	s.slots[i] = tableSlot{}
	s.count--
	t.count--
	// Give back the memory of a shard that emptied (a worker removed or cleared): at
	// an eighth full it halves, to a quarter full, so grow and shrink cannot alternate.
	if len(s.slots) > minShardSlots && 8*s.count < len(s.slots) {
		t.resize(s, len(s.slots)/2)
	}
	return true
}

// resize rehashes a shard into n slots (a power of two that holds its entries).
func (t *blockTable) resize(s *tableShard, n int) {
	old := s.slots
	s.slots = make([]tableSlot, n)
	mask := uint64(n - 1)
	for _, slot := range old {
		if slot.hash == 0 {
			continue
		}
		i := t.mix(slot.hash) & mask
		for s.slots[i].hash != 0 {
			i = (i + 1) & mask
		}
		s.slots[i] = slot
	}
}

// shardBitsFor returns the shard bits for a table expected to hold about n hashes:
// about 4,096 per shard when full, so a resize rehashes at most 64 KiB or so.
func shardBitsFor(n int) uint {
	if n <= 4096 {
		return 0
	}
	return uint(min(bits.Len(uint(n/4096)), 12))
}
