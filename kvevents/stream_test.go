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

// engineLog is what a publisher sent: payload by seq, for a fake replay endpoint.
type engineLog struct {
	t        *testing.T
	payloads map[uint64][]byte
	oldest   uint64 // the replay buffer starts here
	fail     bool
	replays  []uint64
}

func (e *engineLog) batch(seq uint64, events ...Event) Message {
	e.t.Helper()
	p, err := Encode(&Batch{Events: events}, FormArray)
	require.NoError(e.t, err)
	if e.payloads == nil {
		e.payloads = map[uint64][]byte{}
	}
	e.payloads[seq] = p
	return Message{Seq: seq, Payload: p}
}

func (e *engineLog) replay(_ context.Context, from uint64, each func(Message)) error {
	e.replays = append(e.replays, from)
	if e.fail {
		return errors.New("replay endpoint down")
	}
	for seq := max(from, e.oldest); ; seq++ {
		p, ok := e.payloads[seq]
		if !ok {
			return nil
		}
		each(Message{Seq: seq, Payload: p})
	}
}

func newStream(h *harness, replay replayFunc) *stream {
	return &stream{a: h.a, rank: 0, replay: replay, now: h.clock.Now, metrics: h.metrics, log: h.a.log}
}

// blockAt is a one-block chain whose tokens are unique to i.
func blockAt(i int) Event { return stored([]uint64{uint64(1000 + i)}, 0, toks(10*i, testBS)) }

func held(h *harness, i int) bool { return h.overlap(toks(10*i, testBS), "", "") == 1 }

func TestStreamSequences(t *testing.T) {
	tests := []struct {
		name string
		// run drives the stream; want lists which blocks (by blockAt index) are held after.
		run        func(h *harness, e *engineLog, s *stream)
		withReplay bool
		want       map[int]bool
		resets     map[string]float64
		replays    []uint64
	}{
		{
			name: "contiguous", withReplay: true,
			run: func(h *harness, e *engineLog, s *stream) {
				for i := range 3 {
					s.onMessage(context.Background(), e.batch(uint64(i), blockAt(i)))
				}
			},
			want: map[int]bool{0: true, 1: true, 2: true},
		},
		{
			name: "gap without replay clears the worker and rebuilds",
			run: func(h *harness, e *engineLog, s *stream) {
				s.onMessage(context.Background(), e.batch(0, blockAt(0)))
				e.batch(1, removed(1000)) // lost: it evicted block 0
				s.onMessage(context.Background(), e.batch(2, blockAt(2)))
			},
			want:   map[int]bool{0: false, 2: true},
			resets: map[string]float64{reasonGap: 1},
		},
		{
			name: "gap filled by replay", withReplay: true,
			run: func(h *harness, e *engineLog, s *stream) {
				s.onMessage(context.Background(), e.batch(0, blockAt(0), blockAt(5)))
				e.batch(1, removed(1000))
				s.onMessage(context.Background(), e.batch(2, blockAt(2)))
			},
			want:    map[int]bool{0: false, 5: true, 2: true},
			replays: []uint64{1},
		},
		{
			name: "gap older than the replay buffer", withReplay: true,
			run: func(h *harness, e *engineLog, s *stream) {
				s.onMessage(context.Background(), e.batch(0, blockAt(0)))
				e.batch(1, removed(1000))
				e.batch(2, blockAt(2))
				e.oldest = 2
				s.onMessage(context.Background(), e.batch(3, blockAt(3)))
			},
			want:    map[int]bool{0: false, 2: true, 3: true},
			resets:  map[string]float64{reasonGap: 1},
			replays: []uint64{1},
		},
		{
			name: "failed replay clears", withReplay: true,
			run: func(h *harness, e *engineLog, s *stream) {
				s.onMessage(context.Background(), e.batch(0, blockAt(0)))
				e.fail = true
				s.onMessage(context.Background(), e.batch(2, blockAt(2)))
			},
			want:    map[int]bool{0: false, 2: true},
			resets:  map[string]float64{reasonGap: 1},
			replays: []uint64{1},
		},
		{
			name: "joining mid-stream replays the buffer", withReplay: true,
			run: func(h *harness, e *engineLog, s *stream) {
				e.batch(0, blockAt(0))
				e.batch(1, blockAt(1))
				s.onMessage(context.Background(), e.batch(2, blockAt(2)))
			},
			want:    map[int]bool{0: true, 1: true, 2: true},
			replays: []uint64{0},
		},
		{
			name: "restart clears", withReplay: false,
			run: func(h *harness, e *engineLog, s *stream) {
				for i := range 3 {
					s.onMessage(context.Background(), e.batch(uint64(i), blockAt(i)))
				}
				h.clock.Advance(time.Minute) // the engine restarts: new process, seq from 0
				s.onMessage(context.Background(), (&engineLog{t: e.t}).batch(0, blockAt(7)))
			},
			want:   map[int]bool{0: false, 1: false, 2: false, 7: true},
			resets: map[string]float64{reasonRestart: 1},
		},
		{
			name: "restart after a reconnection even at a nearby seq", withReplay: false,
			run: func(h *harness, e *engineLog, s *stream) {
				for i := range 4 {
					s.onMessage(context.Background(), e.batch(uint64(i), blockAt(i)))
				}
				s.reconnected = true
				s.onMessage(context.Background(), (&engineLog{t: e.t}).batch(2, blockAt(7)))
			},
			want:   map[int]bool{0: false, 3: false, 7: true},
			resets: map[string]float64{reasonRestart: 1},
		},
		{
			name: "duplicates are dropped", withReplay: false,
			run: func(h *harness, e *engineLog, s *stream) {
				s.onMessage(context.Background(), e.batch(0, blockAt(0)))
				s.onMessage(context.Background(), e.batch(1, blockAt(1)))
				s.onMessage(context.Background(), e.batch(2, removed(1001)))
				s.onMessage(context.Background(), e.batch(1, blockAt(1)))
			},
			want: map[int]bool{0: true, 1: false},
		},
		{
			name: "an undecodable batch clears", withReplay: false,
			run: func(h *harness, e *engineLog, s *stream) {
				s.onMessage(context.Background(), e.batch(0, blockAt(0)))
				s.onMessage(context.Background(), Message{Seq: 1, Payload: []byte{0x93, 0x01}})
				s.onMessage(context.Background(), e.batch(2, blockAt(2)))
			},
			want:   map[int]bool{0: false, 2: true},
			resets: map[string]float64{reasonDecode: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1, nil)
			e := &engineLog{t: t}
			var replay replayFunc
			if tt.withReplay {
				replay = e.replay
			}
			tt.run(h, e, newStream(h, replay))
			for i, want := range tt.want {
				assert.Equal(t, want, held(h, i), "block %d", i)
			}
			for _, reason := range []string{reasonGap, reasonRestart, reasonDecode} {
				assert.Equal(t, tt.resets[reason], testutil.ToFloat64(h.metrics.resets.WithLabelValues("w", reason)), reason)
			}
			assert.Equal(t, tt.replays, e.replays)
		})
	}
}
