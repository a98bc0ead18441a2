package kvevents

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestAReplayWithAHoleNeverAppliesPastIt: a replay is not always contiguous (a
// ROUTER drops what exceeds its send high-water mark, 1,000 messages by default, and
// an engine replays up to 10,000; a hostile publisher sends what it likes). A batch
// missing from it may have removed blocks, so every hole clears the rank, wherever it
// is: in a replay from 0 (joining), after a first hole, or between the replay's end
// (or failure) and the live message. Before, only the first hole of a replay from
// above 0 was caught, and the rest were applied across silently.
func TestAReplayWithAHoleNeverAppliesPastIt(t *testing.T) {
	tests := []struct {
		name string
		last int    // the stream has applied 0..last (-1: none, it joins)
		sent []int  // what the replay delivers, by seq
		fail bool   // the replay fails after sending them
		live uint64 // the live message that triggers the replay
	}{
		// Batch 1 removed block 0; joining, the replay lost it.
		{name: "joining", last: -1, sent: []int{0, 2}, live: 3},
		// A gap at 1..4: the replay has lost 1 (first hole) and 3, which removed block 2.
		{name: "second hole", last: 0, sent: []int{2, 4}, live: 5},
		// The replay lost 1 and ends at 2; 3, which removed block 2, is lost too.
		{name: "hole after the end", last: 0, sent: []int{2}, live: 4},
		// The same, the replay failing after 2.
		{name: "hole after a failure", last: 0, sent: []int{2}, fail: true, live: 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1, nil)
			e := &engineLog{t: t}
			for i := range 6 {
				if i == 1 || i == 3 {
					e.batch(uint64(i), removed(uint64(1000+i-1))) // evicts block i-1
				} else {
					e.batch(uint64(i), blockAt(i))
				}
			}
			replay := func(_ context.Context, from uint64, each func(Message)) error {
				for _, seq := range tt.sent {
					if uint64(seq) >= from {
						each(Message{Seq: uint64(seq), Payload: e.payloads[uint64(seq)]})
					}
				}
				if tt.fail {
					return errors.New("replay timed out")
				}
				return nil
			}
			s := newStream(h, replay)
			for i := 0; i <= tt.last; i++ {
				s.onMessage(context.Background(), Message{Seq: uint64(i), Payload: e.payloads[uint64(i)]})
			}
			s.onMessage(context.Background(), Message{Seq: tt.live, Payload: e.payloads[tt.live]})
			for _, seq := range tt.sent {
				if seq == 0 || seq == 2 {
					assert.False(t, held(h, seq), "block %d was removed by a batch the replay lost", seq)
				}
			}
			if tt.live%2 == 0 || tt.live == 5 {
				assert.True(t, held(h, int(tt.live)), "the live batch is applied")
			}
		})
	}
}

// TestALiveBatchNumberedLikeTheEndMarkerIsRefused: a live message whose seq is all
// ones (the replay end marker's, never a batch's) is refused. Taken for a batch, it
// made last+1 wrap to 0, so every later batch was a gap whose replay (from 0) brought
// nothing above last: nothing was applied again, engine restarts included.
func TestALiveBatchNumberedLikeTheEndMarkerIsRefused(t *testing.T) {
	h := newHarness(t, 1, nil)
	e := &engineLog{t: t}
	s := newStream(h, e.replay)
	s.onMessage(context.Background(), e.batch(0, blockAt(0)))
	s.onMessage(context.Background(), Message{Seq: endSeq, Payload: e.batch(9, blockAt(9)).Payload})
	s.onMessage(context.Background(), e.batch(1, blockAt(1)))
	s.onMessage(context.Background(), e.batch(2, blockAt(2)))
	assert.False(t, held(h, 9), "the batch numbered like the end marker was applied")
	assert.True(t, held(h, 1), "batch 1 was never applied")
	assert.True(t, held(h, 2), "batch 2 was never applied")
	assert.True(t, held(h, 0), "nothing was lost")
}
