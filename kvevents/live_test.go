package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/fakeclock"
	"github.com/kvroute/kvroute/router"
)

// Generous deadlines for loopback ZMQ on a saturated machine; tests poll, never sleep.
const (
	waitFor = 20 * time.Second
	tick    = 5 * time.Millisecond
)

// live is a Manager subscribed over loopback ZMQ, with its index.
type live struct {
	t     *testing.T
	idx   *index.EventIndex
	m     *Manager
	reg   *prometheus.Registry
	clock *fakeclock.Clock
	stop  func()
}

func startLive(t *testing.T, cfg Config, workers ...router.Worker) *live {
	t.Helper()
	clock := fakeclock.New(time.Unix(1_800_000_000, 0))
	idx, err := index.NewEventIndex(index.Config{CapacityBlocks: 1000, TTL: time.Minute, PendingTTL: time.Second}, clock.Now)
	require.NoError(t, err)
	for _, w := range workers {
		require.NoError(t, idx.SetWorker(w.Name, 0))
	}
	reg := prometheus.NewRegistry()
	m, err := New(cfg, Deps{Index: idx, BlockSize: testBS, Registerer: reg, Now: clock.Now})
	require.NoError(t, err)
	m.SetWorkers(workers)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	l := &live{t: t, idx: idx, m: m, reg: reg, clock: clock, stop: func() { cancel(); <-done }}
	t.Cleanup(l.stop)
	return l
}

func (l *live) overlap(worker string, tokens []uint32) int {
	hashes := index.BlockHashes(nil, tokens, testBS, index.Salt(testModel, "", ""))
	ov := make([]int, 1)
	l.idx.ConfirmedOverlaps(hashes, []string{worker}, ov)
	return ov[0]
}

func (l *live) waitOverlap(worker string, tokens []uint32, want int) {
	l.t.Helper()
	require.Eventually(l.t, func() bool { return l.overlap(worker, tokens) == want }, waitFor, tick,
		"worker %s overlap never reached %d (is %d)", worker, want, l.overlap(worker, tokens))
}

func newPublisher(t *testing.T, cfg PublisherConfig) *Publisher {
	t.Helper()
	p, err := NewPublisher(cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

func eventWorker(name string, p *Publisher) router.Worker {
	return router.Worker{Name: name, Address: "127.0.0.1:1", Models: []string{testModel},
		KVEvents: &router.KVEvents{Endpoint: p.Addr(), ReplayEndpoint: p.ReplayAddr()}}
}

func waitSubscribed(t *testing.T, p *Publisher) {
	t.Helper()
	require.Eventually(t, p.Subscribed, waitFor, tick, "the subscription never reached the publisher")
}

func TestLiveSubscriptionInEveryFormAndReplayLayout(t *testing.T) {
	for _, form := range []Form{FormMap, FormArray} {
		for _, layout := range []ReplayLayout{ReplayWithoutTopic, ReplayWithTopic} {
			t.Run(fmt.Sprintf("form %d layout %d", form, layout), func(t *testing.T) {
				p := newPublisher(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
					Topic: "kv@127.0.0.1@qwen", Form: form, ReplayLayout: layout})
				// Published before anyone listens: only replay can deliver it.
				require.NoError(t, p.Publish(&Batch{Events: []Event{blockAt(0)}}))
				l := startLive(t, DefaultConfig(), eventWorker("w", p))
				waitSubscribed(t, p)

				require.NoError(t, p.Publish(&Batch{Events: []Event{blockAt(1)}}))
				l.waitOverlap("w", toks(10, testBS), 1)
				assert.Equal(t, 1, l.overlap("w", toks(0, testBS)), "the batch sent before the subscription came by replay")

				// A batch lost on the way is a gap the replay fills.
				require.NoError(t, p.PublishPayload(mustEncode(t, form, removed(1000)), false))
				require.NoError(t, p.Publish(&Batch{Events: []Event{blockAt(2)}}))
				l.waitOverlap("w", toks(20, testBS), 1)
				assert.Equal(t, 0, l.overlap("w", toks(0, testBS)), "the lost removal was replayed")
				assert.Equal(t, 1.0, testutil.ToFloat64(l.m.metrics.gaps.WithLabelValues("w")))
				// The replay may itself deliver the last batch, so its blocks can show
				// before the replay is counted.
				// EventuallyWithT reports the last counts it saw: one CI run in the fifteenth
				// session waited 20 s for this under full load (0 of 75 reruns did).
				require.EventuallyWithT(t, func(c *assert.CollectT) {
					replays := map[string]float64{}
					for _, result := range []string{"ok", "partial", "failed"} {
						replays[result] = testutil.ToFloat64(l.m.metrics.replays.WithLabelValues("w", result))
					}
					assert.Equal(c, map[string]float64{"ok": 2, "partial": 0, "failed": 0}, replays, "two replays, both whole (gaps %v)",
						testutil.ToFloat64(l.m.metrics.gaps.WithLabelValues("w")))
				}, waitFor, tick)
				assert.Equal(t, index.ModeEvents, l.idx.Mode("w"))
			})
		}
	}
}

func mustEncode(t *testing.T, form Form, events ...Event) []byte {
	t.Helper()
	p, err := Encode(&Batch{Events: events}, form)
	require.NoError(t, err)
	return p
}

func TestLiveBindModeTakesPublishersThatDialIn(t *testing.T) {
	port := freePort(t)
	w := router.Worker{Name: "w", Address: "127.0.0.1:1", Models: []string{testModel},
		KVEvents: &router.KVEvents{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", port), Bind: true}}
	l := startLive(t, DefaultConfig(), w)
	var p *Publisher
	require.Eventually(t, func() bool {
		var err error
		p, err = NewPublisher(PublisherConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", port), Connect: true})
		return err == nil
	}, waitFor, 10*tick, "the publisher never reached kvroute's bound endpoint")
	t.Cleanup(p.Close)
	waitSubscribed(t, p)
	require.NoError(t, p.Publish(&Batch{Events: []Event{blockAt(0)}}))
	l.waitOverlap("w", toks(0, testBS), 1)
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func TestLiveRestartedPublisherClearsTheWorker(t *testing.T) {
	p := newPublisher(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0"})
	addr := p.Addr()
	l := startLive(t, DefaultConfig(), eventWorker("w", p))
	waitSubscribed(t, p)
	for i := range 3 {
		require.NoError(t, p.Publish(&Batch{Events: []Event{blockAt(i)}}))
	}
	l.waitOverlap("w", toks(20, testBS), 1)

	p.Close() // the engine restarts on the same endpoint, its cache and sequence reset
	var again *Publisher
	require.Eventually(t, func() bool {
		var err error
		again, err = NewPublisher(PublisherConfig{Endpoint: addr})
		return err == nil
	}, waitFor, 10*tick)
	t.Cleanup(again.Close)
	waitSubscribed(t, again)
	require.NoError(t, again.Publish(&Batch{Events: []Event{blockAt(5)}}))
	l.waitOverlap("w", toks(50, testBS), 1)
	assert.Equal(t, 0, l.overlap("w", toks(0, testBS)), "nothing the old process reported survives")
	assert.Equal(t, 1.0, testutil.ToFloat64(l.m.metrics.resets.WithLabelValues("w", reasonRestart)))
}

func TestLiveSilentOrBrokenStreamFallsBackToApproximate(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SilenceTimeout = 10 * time.Second
	p := newPublisher(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0"})
	l := startLive(t, cfg, eventWorker("w", p))
	assert.Equal(t, index.ModeApproximate, l.idx.Mode("w"), "approximate until the first event")
	waitSubscribed(t, p)
	require.NoError(t, p.Publish(&Batch{Events: []Event{blockAt(0)}}))
	l.waitOverlap("w", toks(0, testBS), 1)
	require.Eventually(t, func() bool { return l.idx.Mode("w") == index.ModeEvents }, waitFor, tick, "event mode after the first batch")

	// An idle engine is not silent, however long.
	l.clock.Advance(time.Hour)
	l.m.CheckSilence()
	assert.Equal(t, index.ModeEvents, l.idx.Mode("w"))

	// A decision sends it blocks it never reports: silent.
	require.NoError(t, l.idx.Store("w", index.BlockHashes(nil, toks(90, 2*testBS), testBS, index.Salt(testModel, "", ""))))
	l.clock.Advance(9 * time.Second)
	l.m.CheckSilence()
	assert.Equal(t, index.ModeEvents, l.idx.Mode("w"), "not yet silent_timeout")
	l.clock.Advance(time.Second)
	l.m.CheckSilence()
	assert.Equal(t, index.ModeApproximate, l.idx.Mode("w"))
	assert.Equal(t, 0, l.overlap("w", toks(0, testBS)), "what the silent engine reported is forgotten")
	assert.Equal(t, 1.0, testutil.ToFloat64(l.m.metrics.resets.WithLabelValues("w", reasonSilence)))
	assert.Contains(t, gather(t, l.reg), `kvroute_kvevents_worker_mode{mode="approximate",worker="w"} 1`)

	// Events resume: event mode again. The batch's blocks are applied before the mode
	// turns, so the overlap may show a moment before it.
	require.NoError(t, p.Publish(&Batch{Events: []Event{blockAt(1)}}))
	l.waitOverlap("w", toks(10, testBS), 1)
	require.Eventually(t, func() bool { return l.idx.Mode("w") == index.ModeEvents }, waitFor, tick, "event mode again")
	assert.Contains(t, gather(t, l.reg), `kvroute_kvevents_worker_mode{mode="events",worker="w"} 1`)

	// The engine goes away: broken once silence_timeout has passed without a connection.
	p.Close()
	require.Eventually(t, func() bool {
		for _, s := range l.m.workers["w"].subs {
			if _, down := s.downSince(); down {
				return true
			}
		}
		return false
	}, waitFor, tick, "the lost connection was never noticed")
	l.clock.Advance(10 * time.Second)
	l.m.CheckSilence()
	assert.Equal(t, index.ModeApproximate, l.idx.Mode("w"))
}

func TestLiveWorkersFollowTheFleet(t *testing.T) {
	a := newPublisher(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0"})
	b := newPublisher(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:0"})
	l := startLive(t, DefaultConfig(), eventWorker("a", a))
	waitSubscribed(t, a)

	// A worker added by a reload or discovery gets a subscriber.
	require.NoError(t, l.idx.SetWorker("b", 0))
	l.m.SetWorkers([]router.Worker{eventWorker("a", a), eventWorker("b", b)})
	waitSubscribed(t, b)
	require.NoError(t, b.Publish(&Batch{Events: []Event{blockAt(3)}}))
	l.waitOverlap("b", toks(30, testBS), 1)

	// A removed one's subscriber stops before the index forgets it.
	l.m.SetWorkers([]router.Worker{eventWorker("b", b)})
	require.Eventually(t, func() bool { return !a.Subscribed() }, waitFor, tick, "the removed worker's subscriber kept its connection")
	assert.Len(t, l.m.snapshot(), 1)
}

func gather(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var buf bytes.Buffer
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := ""
			for i, lp := range m.GetLabel() {
				if i > 0 {
					labels += ","
				}
				labels += fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue())
			}
			fmt.Fprintf(&buf, "%s{%s} %v\n", mf.GetName(), labels, m.GetGauge().GetValue()+m.GetCounter().GetValue())
		}
	}
	return buf.String()
}

// TestLimitedConnRefusesOversizedMessages feeds a ZMTP byte stream through the
// size-limited connection: frames within the limit pass byte for byte, a header that
// takes a message past it fails the read before the body is read.
func TestLimitedConnRefusesOversizedMessages(t *testing.T) {
	greeting := make([]byte, 64)
	frame := func(flags byte, body []byte) []byte {
		if len(body) > 255 {
			return append(binary.BigEndian.AppendUint64([]byte{flags | 0x02}, uint64(len(body))), body...)
		}
		return append([]byte{flags, byte(len(body))}, body...)
	}
	ok := bytes.Join([][]byte{greeting, zmtpReady("PUB"), frame(0x01, []byte("t")), frame(0x01, make([]byte, 8)), frame(0, make([]byte, 300))}, nil)
	tests := []struct {
		name    string
		stream  []byte
		wantErr bool
	}{
		{"within the limit", ok, false},
		{"one huge frame header", append(append([]byte{}, ok...), 0x02, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff), true},
		{"many frames adding up", append(append([]byte{}, ok...), bytes.Repeat(frame(0x01, make([]byte, 200)), 10)...), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, server := net.Pipe()
			go func() {
				for i := 0; i < len(tt.stream); i += 7 { // odd chunks cross every header
					if _, err := server.Write(tt.stream[i:min(i+7, len(tt.stream))]); err != nil {
						return
					}
				}
				server.Close()
			}()
			c := newLimitedConn(context.Background(), client, 1000, connHooks{})
			got, err := io.ReadAll(c)
			client.Close()
			if tt.wantErr {
				assert.ErrorAs(t, err, new(errMessageTooLarge))
				assert.Less(t, len(got), len(tt.stream))
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.stream, got)
		})
	}
}
