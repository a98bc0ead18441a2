package kvevents

import (
	"context"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/router"
)

// TestARestartedEngineAlreadyPastOurSequenceIsNotTakenForAGap: an engine that restarts
// and publishes more batches than kvroute had seen before kvroute hears from it again
// shows a sequence number past the last one, as a gap does. Taken for a gap, the replay
// from last+1 brought the new process's batches on top of what the old process had
// reported, and those stale blocks stayed in the index. Over loopback with the
// in-repo publisher, kvroute dialling the engine and the engine dialling kvroute.
func TestARestartedEngineAlreadyPastOurSequenceIsNotTakenForAGap(t *testing.T) {
	for _, bind := range []bool{false, true} {
		t.Run(fmt.Sprintf("bind %v", bind), func(t *testing.T) {
			endpoint := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
			replay := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
			l := startLive(t, DefaultConfig(), router.Worker{Name: "w", Address: "127.0.0.1:1", Models: []string{testModel},
				KVEvents: &router.KVEvents{Endpoint: endpoint, Bind: bind, ReplayEndpoint: replay}})
			start := func() *Publisher {
				var p *Publisher
				require.Eventually(t, func() bool {
					var err error
					p, err = NewPublisher(PublisherConfig{Endpoint: endpoint, Connect: bind, ReplayEndpoint: replay})
					return err == nil
				}, waitFor, 10*tick, "the engine never started")
				t.Cleanup(p.Close)
				return p
			}
			p := start()
			waitSubscribed(t, p)
			for i := range 3 {
				require.NoError(t, p.Publish(&Batch{Events: []Event{blockAt(i)}}))
			}
			l.waitOverlap("w", toks(20, testBS), 1)

			p.Close() // the engine restarts, its cache and sequence reset
			again := start()
			// It publishes batches 0..5 before kvroute hears from it again.
			for i := range 6 {
				require.NoError(t, again.PublishPayload(mustEncode(t, FormArray, blockAt(10+i)), false))
			}
			waitSubscribed(t, again)
			require.NoError(t, again.Publish(&Batch{Events: []Event{blockAt(16)}}))
			l.waitOverlap("w", toks(160, testBS), 1)
			for i := range 6 {
				assert.Equal(t, 1, l.overlap("w", toks(10*(10+i), testBS)), "block %d of the restarted engine", 10+i)
			}
			for i := range 3 {
				assert.Equal(t, 0, l.overlap("w", toks(10*i, testBS)), "block %d, reported before the restart, is still in the index", i)
			}
			assert.Equal(t, 1.0, testutil.ToFloat64(l.m.metrics.resets.WithLabelValues("w", reasonRestart)))
		})
	}
}

// TestAStreamBackAfterAReconnectionChecksTheLastBatch: after a reconnection, a message
// past the last batch applied may come from the same engine (a network fault) or from
// a restarted one already past it; the stream replays from its last batch and keeps
// its entries only if that batch comes back unchanged.
func TestAStreamBackAfterAReconnectionChecksTheLastBatch(t *testing.T) {
	tests := []struct {
		name string
		// back sets up what the engine (old, or restarted) holds after the fault and
		// returns the engine to replay from and the live message that arrives first.
		back    func(old *engineLog) (*engineLog, Message)
		noReply bool
		want    map[int]bool // blocks by blockAt index
		replays []uint64
		restart float64
	}{
		{
			name: "a restarted engine past the last batch",
			back: func(old *engineLog) (*engineLog, Message) {
				e := &engineLog{t: old.t}
				for i := range 6 {
					e.batch(uint64(i), blockAt(10+i))
				}
				return e, e.batch(6, blockAt(16))
			},
			want:    map[int]bool{0: false, 1: false, 2: false, 10: true, 13: true, 16: true},
			replays: []uint64{2, 0}, restart: 1,
		},
		{
			name: "a restarted engine just at the next number",
			back: func(old *engineLog) (*engineLog, Message) {
				e := &engineLog{t: old.t}
				for i := range 3 {
					e.batch(uint64(i), blockAt(10+i))
				}
				return e, e.batch(3, blockAt(13))
			},
			want:    map[int]bool{0: false, 2: false, 10: true, 13: true},
			replays: []uint64{2, 0}, restart: 1,
		},
		{
			name: "the same engine, batches missed",
			back: func(old *engineLog) (*engineLog, Message) {
				old.batch(3, removed(1000))
				old.batch(4, blockAt(4))
				return old, old.batch(5, blockAt(5))
			},
			want:    map[int]bool{0: false, 1: true, 2: true, 4: true, 5: true},
			replays: []uint64{2},
		},
		{
			name: "the same engine, nothing missed",
			back: func(old *engineLog) (*engineLog, Message) {
				return old, old.batch(3, blockAt(3))
			},
			want:    map[int]bool{0: true, 2: true, 3: true},
			replays: []uint64{2},
		},
		{
			name: "the same engine, the last batch no longer buffered",
			back: func(old *engineLog) (*engineLog, Message) {
				for i := 3; i <= 5; i++ {
					old.batch(uint64(i), blockAt(i))
				}
				old.oldest = 3
				return old, old.batch(6, blockAt(6))
			},
			want:    map[int]bool{0: false, 2: false, 3: true, 6: true},
			replays: []uint64{2, 0}, restart: 1,
		},
		{
			name: "a replay that fails",
			back: func(old *engineLog) (*engineLog, Message) {
				old.fail = true
				return old, old.batch(3, blockAt(3))
			},
			want:    map[int]bool{0: false, 2: false, 3: true},
			replays: []uint64{2}, restart: 1,
		},
		{
			name:    "no replay endpoint: the next number is taken as it comes",
			noReply: true,
			back: func(old *engineLog) (*engineLog, Message) {
				return old, old.batch(3, blockAt(3))
			},
			want: map[int]bool{0: true, 3: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1, nil)
			old := &engineLog{t: t}
			cur := old
			var replays []uint64
			var replay replayFunc = func(ctx context.Context, from uint64, each func(Message)) error {
				replays = append(replays, from)
				return cur.replay(ctx, from, each)
			}
			if tt.noReply {
				replay = nil
			}
			s := newStream(h, replay)
			for i := range 3 {
				s.onMessage(context.Background(), old.batch(uint64(i), blockAt(i)))
			}
			var m Message
			cur, m = tt.back(old)
			s.reconnected = true
			s.onMessage(context.Background(), m)
			for i, want := range tt.want {
				assert.Equal(t, want, held(h, i), "block %d", i)
			}
			assert.Equal(t, tt.replays, replays)
			assert.Equal(t, tt.restart, testutil.ToFloat64(h.metrics.resets.WithLabelValues("w", reasonRestart)))
		})
	}
}
