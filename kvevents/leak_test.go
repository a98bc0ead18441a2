package kvevents

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/router"
)

// blockedQueueReaders returns the headers of the goroutines zmq4 runs to read a
// connection into its socket's queue that are blocked on a full queue.
func blockedQueueReaders() map[string]bool {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	out := map[string]bool{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		header, _, _ := strings.Cut(g, "\n")
		if strings.Contains(g, "zmq4.(*qreader).listen") && strings.Contains(header, "[chan send") {
			id, _, _ := strings.Cut(header, " [")
			out[id] = true
		}
	}
	return out
}

// TestAStoppedSubscriberLeavesNoReaderBehind: zmq4 reads each connection into a queue
// of 10 messages from a goroutine of its own that blocks while the queue is full and
// never looks at the socket's context then. A subscriber stopped while its publisher
// had filled that queue (its stream busy in a replay, or slower than the engine) left
// that goroutine blocked for good, holding up to 11 messages of up to 64 MB each.
func TestAStoppedSubscriberLeavesNoReaderBehind(t *testing.T) {
	before := blockedQueueReaders()
	replay, _ := mute(t) // the stream's replay hangs: nothing reads the queue
	p := newPublisher(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0"})
	cfg := DefaultConfig()
	cfg.ReplayTimeout = time.Minute
	w := router.Worker{Name: "w", Address: "127.0.0.1:1", Models: []string{testModel},
		KVEvents: &router.KVEvents{Endpoint: p.Addr(), ReplayEndpoint: replay}}
	l := startLive(t, cfg, w)
	waitSubscribed(t, p)
	var leaked []string
	require.Eventually(t, func() bool {
		// Batch 1 first (0 is never sent): the stream joins late and replays.
		require.NoError(t, p.PublishPayload(mustEncode(t, FormArray, blockAt(0)), p.seq > 0))
		leaked = nil
		for id := range blockedQueueReaders() {
			if !before[id] {
				leaked = append(leaked, id)
			}
		}
		return len(leaked) > 0
	}, waitFor, tick, "the queue never filled")

	within(t, waitFor, "SetWorkers removing the worker", func() { l.m.SetWorkers(nil) })
	require.Eventually(t, func() bool {
		now := blockedQueueReaders()
		for _, id := range leaked {
			if now[id] {
				return false
			}
		}
		return true
	}, 5*time.Second, tick, "zmq4's reader of the stopped subscriber's connection is still blocked: %v", leaked)
}

// newBlockedQueueReaders returns the blocked queue readers not in before.
func newBlockedQueueReaders(before map[string]bool) []string {
	var out []string
	for id := range blockedQueueReaders() {
		if !before[id] {
			out = append(out, id)
		}
	}
	return out
}

// floodingReplayEngine is a replay endpoint on loopback that answers every request
// with 100 batches and no end marker.
func floodingReplayEngine(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	router := zmq4.NewRouter(ctx, zmq4.WithLogger(discardLogger()))
	require.NoError(t, router.Listen("tcp://127.0.0.1:0"))
	payload := mustEncode(t, FormArray, blockAt(0))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			msg, err := router.Recv()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				continue
			}
			id, _, err := ParseReplayRequest(msg.Frames)
			if err != nil {
				continue
			}
			go func() {
				for seq := range uint64(100) {
					if router.Send(zmq4.NewMsgFrom(append([][]byte{id}, ReplayFrames(ReplayWithoutTopic, "", seq, payload)...)...)) != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { cancel(); _ = router.Close(); <-done })
	return endpointOf(router, "tcp://127.0.0.1:0")
}

// TestATimedOutReplayLeavesNoReaderBehind: a replay that times out while the engine
// is still sending (10,000 batches may take longer than replay_timeout to apply)
// closed its DEALER with zmq4's reader of the connection blocked on the full queue,
// for good, about every other time.
func TestATimedOutReplayLeavesNoReaderBehind(t *testing.T) {
	before := blockedQueueReaders()
	const timeout = 100 * time.Millisecond
	replay := newReplayer(floodingReplayEngine(t), timeout, discardLogger())
	for range 24 {
		start := time.Now()
		iteration := blockedQueueReaders()
		first := true
		err := replay(context.Background(), 0, func(Message) {
			if first {
				// Slower than the engine until the timeout: the queue fills.
				first = false
				require.Eventually(t, func() bool {
					return time.Since(start) > timeout && len(newBlockedQueueReaders(iteration)) > 0
				}, waitFor, tick, "the queue never filled")
			}
		})
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
	require.Eventually(t, func() bool { return len(newBlockedQueueReaders(before)) == 0 }, 5*time.Second, tick,
		"zmq4's readers of timed-out replays are still blocked: %v", newBlockedQueueReaders(before))
}
