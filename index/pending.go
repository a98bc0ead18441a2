package index

import (
	"fmt"
	"slices"
	"time"
)

// EventIndex is the event-mode index of DESIGN §4: the blocks each engine reported in
// its KV events (confirmed), plus the blocks the router just sent a worker that its
// engine has not reported yet (pending). Without the pending part, every decision made
// between a routing decision and the engine's BlockStored would see the chosen worker
// as not holding the prompt and not growing: a burst of new sessions would all land on
// the same "emptiest" worker. Pending blocks are forgotten when the engine confirms or
// removes them, or after the pending TTL if it never does (the request failed, or was
// served from blocks the engine already had).
//
// The router reads it through Overlaps and Footprints and records its decisions with
// Store; the engines' event consumer calls BlockStored, BlockRemoved and
// AllBlocksCleared.
type EventIndex struct {
	confirmed, pending *Index
}

// NewEventIndex returns an empty event-mode index. cfg bounds each worker's confirmed
// blocks (its TTL should be 0 or long: the engines' events are authoritative);
// pendingTTL is how long a decision's blocks count without an engine event, and must be
// positive.
func NewEventIndex(cfg Config, pendingTTL time.Duration, now func() time.Time) (*EventIndex, error) {
	if pendingTTL <= 0 {
		return nil, fmt.Errorf("index.pending_ttl: must be > 0, got %s", pendingTTL)
	}
	confirmed, err := New(cfg, now)
	if err != nil {
		return nil, err
	}
	pending, err := New(Config{CapacityBlocks: cfg.CapacityBlocks, TTL: pendingTTL}, now)
	if err != nil {
		return nil, err
	}
	return &EventIndex{confirmed: confirmed, pending: pending}, nil
}

// SetWorker adds a worker or changes its capacity in blocks (0: the config's default).
func (x *EventIndex) SetWorker(name string, capacityBlocks int) error {
	if err := x.confirmed.SetWorker(name, capacityBlocks); err != nil {
		return err
	}
	return x.pending.SetWorker(name, capacityBlocks)
}

// RemoveWorker forgets a worker and everything it held or was sent.
func (x *EventIndex) RemoveWorker(name string) {
	x.confirmed.RemoveWorker(name)
	x.pending.RemoveWorker(name)
}

// Store records a routing decision: the worker is about to hold these blocks. Only the
// blocks past what the worker already reported are pending, so confirmed and pending
// blocks stay disjoint and a worker's footprint is their sum.
func (x *EventIndex) Store(name string, hashes []uint64) error {
	var held [1]int
	x.confirmed.Overlaps(hashes, []string{name}, held[:])
	return x.pending.Store(name, hashes[held[0]:])
}

// BlockStored applies an engine's BlockStored event: the blocks are confirmed and no
// longer pending.
func (x *EventIndex) BlockStored(name string, hashes []uint64) error {
	if err := x.confirmed.Store(name, hashes); err != nil {
		return err
	}
	return x.pending.Remove(name, hashes)
}

// BlockRemoved applies an engine's BlockRemoved event.
func (x *EventIndex) BlockRemoved(name string, hashes []uint64) error {
	if err := x.confirmed.Remove(name, hashes); err != nil {
		return err
	}
	return x.pending.Remove(name, hashes)
}

// AllBlocksCleared applies an engine's AllBlocksCleared event (or a restart or an event
// gap): the worker holds nothing the index can vouch for.
func (x *EventIndex) AllBlocksCleared(name string) error {
	if err := x.confirmed.Clear(name); err != nil {
		return err
	}
	return x.pending.Clear(name)
}

// Overlaps writes to dst[i] the leading blocks workers[i] holds, confirmed or pending:
// the walk runs through the confirmed blocks and continues through the pending ones.
func (x *EventIndex) Overlaps(hashes []uint64, workers []string, dst []int) {
	x.confirmed.Overlaps(hashes, workers, dst)
	// Continue each worker's walk in the pending blocks from where its confirmed walk
	// stopped; workers that stopped at the same block share one lookup.
	confirmed := slices.Clone(dst)
	starts := slices.Compact(slices.Sorted(slices.Values(confirmed)))
	var sub []string
	var idx []int
	for _, start := range starts {
		if start >= len(hashes) {
			continue
		}
		sub, idx = sub[:0], idx[:0]
		for i, ov := range confirmed {
			if ov == start {
				sub, idx = append(sub, workers[i]), append(idx, i)
			}
		}
		more := make([]int, len(sub))
		x.pending.Overlaps(hashes[start:], sub, more)
		for j, i := range idx {
			dst[i] += more[j]
		}
	}
}

// Footprints writes each worker's confirmed plus pending blocks and its capacity.
func (x *EventIndex) Footprints(workers []string, held, capacity []int) {
	x.confirmed.Footprints(workers, held, capacity)
	pending := make([]int, len(workers))
	x.pending.Footprints(workers, pending, make([]int, len(workers)))
	for i := range held {
		held[i] += pending[i]
	}
}

// Entries returns the confirmed and pending (block, worker) pairs held.
func (x *EventIndex) Entries() (confirmed, pending int) {
	return x.confirmed.Entries(), x.pending.Entries()
}
