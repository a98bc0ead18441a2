package kvevents

import (
	"testing"
)

// H72-3: a malformed event's group_idx (any int64) is recorded in the applier's
// groups map before the event is refused, and that map is never cleared: an engine
// can grow it by one entry per ~30-byte event without bound.
func TestH72MalformedGroupIdxGrowsTheGroupsMap(t *testing.T) {
	h := newHarness(t, 1, nil)
	const n = 5000
	events := make([]Event, n)
	for i := range events {
		events[i] = Event{Type: TypeBlockStored, GroupIdx: 1<<20 + i, SpecKind: "x"} // out of range: Malformed "group_idx"
	}
	payload, err := Encode(&Batch{Events: events}, FormMap)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.a.Apply(0, payload); err != nil {
		t.Fatal(err)
	}
	h.apply(0, Event{Type: TypeAllBlocksCleared})
	t.Logf("groups map: %d entries after %d malformed events and a clear", len(h.a.groups), n)
	if len(h.a.groups) >= n {
		t.Errorf("groups map holds %d entries for malformed events' group_idx", len(h.a.groups))
	}
}

// H72-6: the applier's groups map (cache group → indexable, from the spec kind of a
// BlockStored) is never reset, not by AllBlocksCleared nor by a restart, and removals
// are skipped for a group once marked not indexable, while stores without a kind
// (older engines send none) are still applied. One BlockStored naming group 0 a
// sliding-window group (or an engine restarted with another model) leaves every
// later block of group 0 in the index after the engine removed it: over-reported.
func TestH72AGroupOnceMarkedNotIndexableNeverLosesItsBlocks(t *testing.T) {
	h := newHarness(t, 1, nil)
	sw := stored([]uint64{50}, 0, toks(500, testBS))
	sw.SpecKind = "sliding_window" // group 0
	h.apply(0, sw)
	h.apply(0, Event{Type: TypeAllBlocksCleared}) // the engine restarts (or says it cleared)
	prompt := toks(0, 2*testBS)
	h.apply(0, stored([]uint64{1, 2}, 0, prompt)) // no spec kind, group 0: applied
	if got := h.overlap(prompt, "", ""); got != 2 {
		t.Fatalf("overlap %d after the store, want 2", got)
	}
	h.apply(0, removed(1, 2))
	if got := h.overlap(prompt, "", ""); got != 0 {
		t.Errorf("the engine removed both blocks, yet the index still reports %d held (removals counted not_indexable: %v)",
			got, h.count(TypeBlockRemoved, outcomeNotIndexable))
	}
}
