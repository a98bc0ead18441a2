package kvevents

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// TestTheLiveStreamCatchingUpAfterAReplayIsNotARestart: a replay brings every batch the
// engine buffers from the gap on, including those it published after the live message
// that revealed the gap; those arrive live afterwards and are duplicates. Before, the
// first of them was taken for a restarted publisher, clearing the worker (and replaying
// it from 0, after which the same happened again) as soon as the replay had brought
// more than dupWindow batches beyond it, or had lasted more than restartPause.
func TestTheLiveStreamCatchingUpAfterAReplayIsNotARestart(t *testing.T) {
	for _, tt := range []struct {
		name  string
		ahead int           // batches the engine published after the live message that revealed the gap
		takes time.Duration // how long the replay lasts
	}{
		{name: "many batches ahead", ahead: 2 * dupWindow},
		{name: "a long replay", ahead: 3, takes: 2 * restartPause},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1, nil)
			e := &engineLog{t: t}
			s := newStream(h, func(ctx context.Context, from uint64, each func(Message)) error {
				h.clock.Advance(tt.takes)
				return e.replay(ctx, from, each)
			})
			s.onMessage(context.Background(), e.batch(0, blockAt(0)))
			e.batch(1, blockAt(1)) // lost
			for i := 2; i <= 2+tt.ahead; i++ {
				e.batch(uint64(i), blockAt(i))
			}
			for i := 2; i <= 2+tt.ahead; i++ { // 2 reveals the gap; the rest were replayed
				s.onMessage(context.Background(), Message{Seq: uint64(i), Payload: e.payloads[uint64(i)]})
			}
			s.onMessage(context.Background(), e.batch(uint64(3+tt.ahead), blockAt(3+tt.ahead)))
			assert.Equal(t, 0.0, testutil.ToFloat64(h.metrics.resets.WithLabelValues("w", reasonRestart)), "a restart was seen")
			assert.Equal(t, []uint64{1}, e.replays)
			for i := 0; i <= 3+tt.ahead; i++ {
				assert.True(t, held(h, i), "block %d", i)
			}
		})
	}
}

// TestAReplayedBatchNumberedFarPastTheLiveStreamIsRefused: a replay brings what the
// engine buffers from the seq asked for on, the batches it published after the live
// message that asked included, up to its 10,000; one numbered further (here up to
// 2^62, not the end marker) is refused and counted, whatever asked for the replay.
// Taken, it became the stream's last batch, and every later live batch, numbered
// normally, was dropped as one the replay had already delivered, until the next
// reconnection.
func TestAReplayedBatchNumberedFarPastTheLiveStreamIsRefused(t *testing.T) {
	tests := []struct {
		name  string
		asks  string // what asks for the replay: a gap, a reconnection (checking the last batch), joining
		ahead uint64 // the replayed batch's seq past the live message that asked
		taken bool
	}{
		{"far ahead, filling a gap", "gap", 1 << 62, false},
		{"one past the engine's buffer, filling a gap", "gap", replayAhead + 1, false},
		{"at the end of the engine's buffer, filling a gap", "gap", replayAhead, true},
		{"far ahead, after a reconnection", "reconnection", 1 << 62, false},
		{"far ahead, joining", "joining", 1 << 62, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1, nil)
			e := &engineLog{t: t}
			const bogus = 99 // blockAt(99): the replayed batch's block
			var live uint64  // the live message that asks for the replay
			s := newStream(h, func(ctx context.Context, from uint64, each func(Message)) error {
				if err := e.replay(ctx, from, each); err != nil {
					return err
				}
				p, err := Encode(&Batch{Events: []Event{blockAt(bogus)}}, FormArray)
				require.NoError(t, err)
				each(Message{Seq: live + tt.ahead, Payload: p})
				return nil
			})
			ctx := context.Background()
			for i := range 3 {
				e.batch(uint64(i), blockAt(i))
			}
			switch tt.asks { // then 3 comes live
			case "gap": // 1 and 2 are lost
				s.onMessage(ctx, Message{Seq: 0, Payload: e.payloads[0]})
			case "reconnection": // 2 was published while disconnected
				s.onMessage(ctx, Message{Seq: 0, Payload: e.payloads[0]})
				s.onMessage(ctx, Message{Seq: 1, Payload: e.payloads[1]})
				s.reconnected = true
			}
			live = 3
			s.onMessage(ctx, e.batch(live, blockAt(int(live))))
			for i := live + 1; i < 10; i++ {
				h.clock.Advance(10 * time.Millisecond)
				s.onMessage(ctx, e.batch(i, blockAt(int(i))))
			}
			assert.Equal(t, tt.taken, held(h, bogus), "the batch numbered %d past the live stream", tt.ahead)
			if tt.taken {
				return
			}
			assert.Equal(t, 1.0, testutil.ToFloat64(h.metrics.decodeErrors.WithLabelValues("w")))
			for i := range 10 {
				assert.True(t, held(h, i), "block %d: the live batches after the replay are applied", i)
			}
		})
	}
}
