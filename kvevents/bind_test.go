package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/router"
)

// A hand-written ZMTP 3.0 peer, for clients that zmq4 itself would not be: one of a
// socket type the subscriber refuses, one that breaks off the handshake, many at once.

// zmtpGreeting is a client's greeting with the NULL mechanism.
func zmtpGreeting() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	return g
}

// zmtpFrame frames body with flags (0x01 more, 0x04 command), in the short or the
// long form.
func zmtpFrame(flags byte, body []byte) []byte {
	if len(body) > 255 {
		return append(binary.BigEndian.AppendUint64([]byte{flags | 0x02}, uint64(len(body))), body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

// zmtpCommand is a command's body: its name and data.
func zmtpCommand(name string, data []byte) []byte {
	return append(append([]byte{byte(len(name))}, name...), data...)
}

// zmtpReady is a READY command announcing socketType ("": no Socket-Type property).
func zmtpReady(socketType string) []byte {
	if socketType == "" {
		return zmtpFrame(0x04, zmtpCommand("READY", nil))
	}
	return zmtpFrame(0x04, zmtpCommand("READY", zmtpProperty("Socket-Type", socketType)))
}

// zmtpProperty is one metadata property of a READY.
func zmtpProperty(name, value string) []byte {
	p := append([]byte{byte(len(name))}, name...)
	p = binary.BigEndian.AppendUint32(p, uint32(len(value)))
	return append(p, value...)
}

// dialZMTP connects to addr (host:port) and shakes hands (handshakeZMTP). An error
// means the server closed the connection on the way.
func dialZMTP(t *testing.T, addr string, first []byte) (net.Conn, error) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn, handshakeZMTP(t, conn, first)
}

// handshakeZMTP sends a greeting, reads the other side's greeting and READY, and sends
// first: a dialling or an accepting peer's part, as zmq4 plays either.
func handshakeZMTP(t *testing.T, conn net.Conn, first []byte) error {
	t.Helper()
	require.NoError(t, conn.SetDeadline(time.Now().Add(waitFor))) // a safety net
	if _, err := conn.Write(zmtpGreeting()); err != nil {
		return err
	}
	if _, err := io.ReadFull(conn, make([]byte, 64)); err != nil {
		return err
	}
	header := make([]byte, 2)
	if _, err := io.ReadFull(conn, header); err != nil {
		return err
	}
	size := uint64(header[1])
	if header[0]&0x02 != 0 {
		long := make([]byte, 8)
		long[0] = header[1]
		if _, err := io.ReadFull(conn, long[1:]); err != nil {
			return err
		}
		size = binary.BigEndian.Uint64(long)
	}
	require.Less(t, size, uint64(1<<16), "the other side's READY")
	if _, err := io.ReadFull(conn, make([]byte, size)); err != nil {
		return err
	}
	if _, err := conn.Write(first); err != nil {
		return err
	}
	require.NoError(t, conn.SetDeadline(time.Time{}))
	return nil
}

// closedByServer reads conn until the server closes it, or until the safety net.
func closedByServer(t *testing.T, conn net.Conn) bool {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(waitFor)))
	_, err := io.Copy(io.Discard, conn)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	return err == nil || errors.Is(err, syscall.ECONNRESET)
}

// boundWorker starts a Manager whose worker w binds a loopback port, and returns the
// port's host:port once it takes connections.
func boundWorker(t *testing.T, cfg Config) (*live, string) {
	t.Helper()
	return boundWorkerReplaying(t, cfg, "")
}

// boundWorkerReplaying is boundWorker for a worker whose replay endpoint is replay
// ("": none).
func boundWorkerReplaying(t *testing.T, cfg Config, replay string) (*live, string) {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	w := router.Worker{Name: "w", Address: "127.0.0.1:1", Models: []string{testModel},
		KVEvents: &router.KVEvents{Endpoint: "tcp://" + addr, Bind: true, ReplayEndpoint: replay}}
	l := startLive(t, cfg, w)
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	}, waitFor, 10*tick, "kvroute never bound its endpoint")
	return l, addr
}

// TestABoundSocketClosesAPeerWhoseHandshakeZmq4Refuses: zmq4 refuses a peer after the
// ZMTP handshake's READY exchange (a socket type SUB does not pair with, or a first
// command that is not a well-formed READY) and abandons its connection without closing
// it. The handshake timer stopped at the peer's first frame, so a bound socket kept
// such a peer's connection (and the file descriptor) until the peer closed it.
func TestABoundSocketClosesAPeerWhoseHandshakeZmq4Refuses(t *testing.T) {
	tests := []struct {
		name  string
		first []byte // what the peer sends after the greetings
	}{
		{"a REQ socket", zmtpReady("REQ")},
		{"a SUB socket", zmtpReady("SUB")},
		{"a command other than READY", zmtpFrame(0x04, zmtpCommand("PING", []byte{0, 1}))},
		{"a READY in two frames", append(zmtpFrame(0x05, zmtpCommand("READY", nil)), zmtpFrame(0x04, []byte("x"))...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, addr := boundWorker(t, DefaultConfig())
			conn, err := dialZMTP(t, addr, tt.first)
			require.NoError(t, err, "the handshake up to the peer's READY")
			assert.True(t, closedByServer(t, conn), "the refused peer's connection is still open")
		})
	}
}

// TestAPeerWithABadReadyDoesNotCrashKvroute: zmq4 panics on a peer's READY without a
// socket type or with one it does not know (SocketType.IsCompatible), and on
// properties that overrun the command (Property.Write), in the goroutine that shakes
// hands: zmq4's accept loop for a bound endpoint, the subscriber's for a dialled one.
// Any client that reached a bound endpoint, or anything answering at an engine's
// address, took kvroute down. Such a peer is now refused and its connection closed, and
// a bound endpoint still takes publishers after it.
func TestAPeerWithABadReadyDoesNotCrashKvroute(t *testing.T) {
	ready := func(props ...[]byte) []byte {
		return zmtpFrame(0x04, zmtpCommand("READY", bytes.Join(props, nil)))
	}
	tests := []struct {
		name  string
		ready []byte
	}{
		{"no socket type", zmtpReady("")},
		{"an identity and no socket type", ready(zmtpProperty("Identity", "x"))},
		{"a socket type zmq4 does not know", zmtpReady("pub")},
		{"the socket type's name in capitals", ready(zmtpProperty("SOCKET-TYPE", "PUB"))},
		{"a known socket type, then an unknown one", ready(zmtpProperty("Socket-Type", "PUB"), zmtpProperty("socket-Type", "BOGUS"))},
		{"a name running past the command", ready([]byte{3, 'a', 'b'})},
		{"a value length cut short", ready(zmtpProperty("Socket-Type", "PUB"), []byte{1, 'a', 0, 0})},
	}
	t.Run("bound", func(t *testing.T) {
		l, addr := boundWorker(t, DefaultConfig())
		for _, tt := range tests {
			conn, err := dialZMTP(t, addr, tt.ready)
			require.NoError(t, err, "%s: the handshake up to the peer's READY", tt.name)
			assert.True(t, closedByServer(t, conn), "%s: the refused peer's connection is still open", tt.name)
		}
		p := newPublisher(t, PublisherConfig{Endpoint: "tcp://" + addr, Connect: true})
		waitSubscribed(t, p)
		require.NoError(t, p.Publish(&Batch{Events: []Event{blockAt(0)}}))
		l.waitOverlap("w", toks(0, testBS), 1)
	})
	t.Run("dialled", func(t *testing.T) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				addr, conns := mute(t)
				startLive(t, DefaultConfig(), router.Worker{Name: "w", Address: "127.0.0.1:1", Models: []string{testModel},
					KVEvents: &router.KVEvents{Endpoint: addr}})
				var conn net.Conn
				select {
				case conn = <-conns:
				case <-time.After(waitFor):
					t.Fatal("the subscriber never dialled")
				}
				require.NoError(t, handshakeZMTP(t, conn, tt.ready), "the handshake up to the engine's READY")
				assert.True(t, closedByServer(t, conn), "the subscriber kept the refused engine's connection")
			})
		}
	})
}

// TestABoundEndpointRefusesConnectionsBeyondItsCap: every connection to a bound
// endpoint can hold a message of up to maxMessageBytes, and a bound endpoint took any
// number of them, so its memory had no bound (a dialled one holds the socket's queue
// and one connection). Connections beyond kv_events.max_bind_connections are closed on
// arrival and counted; one that ends frees its place.
func TestABoundEndpointRefusesConnectionsBeyondItsCap(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxBindConnections = 2
	l, addr := boundWorker(t, cfg)
	var held []net.Conn
	for i := range cfg.MaxBindConnections {
		conn, err := dialZMTP(t, addr, zmtpReady("PUB"))
		require.NoError(t, err, "connection %d, within the cap, was refused", i+1)
		held = append(held, conn)
	}
	const beyond = 3
	for i := range beyond {
		conn, err := dialZMTP(t, addr, zmtpReady("PUB"))
		if assert.Error(t, err, "connection %d beyond the cap was taken", i+1) {
			continue
		}
		assert.True(t, closedByServer(t, conn), "connection %d beyond the cap was kept", i+1)
	}
	assert.Equal(t, float64(beyond), testutil.ToFloat64(l.m.metrics.refusedConns.WithLabelValues("w")))

	// A publisher that leaves frees its place for the next (its end is noticed by zmq4's
	// reader of the connection, so the next one may be refused a few times first).
	require.NoError(t, held[0].Close())
	var p *Publisher
	require.Eventually(t, func() bool {
		var err error
		p, err = NewPublisher(PublisherConfig{Endpoint: "tcp://" + addr, Connect: true})
		return err == nil
	}, waitFor, 10*tick, "the place of the connection that ended was never freed")
	t.Cleanup(p.Close)
	waitSubscribed(t, p)
	require.NoError(t, p.Publish(&Batch{Events: []Event{blockAt(0)}}))
	l.waitOverlap("w", toks(0, testBS), 1)
}

// TestQuietClientsNoLongerLockOutABoundEndpoint: a client that shook hands with a
// bound endpoint and then sent nothing held its place for good, so
// kv_events.max_bind_connections of them (bind mode has no authentication) locked out
// a restarted engine. A newcomer to a full endpoint now takes the place of a client
// quiet for kv_events.bind_idle_displace_after or more, and is refused as before when
// none has been quiet that long.
func TestQuietClientsNoLongerLockOutABoundEndpoint(t *testing.T) {
	const after = 10 * time.Second
	tests := []struct {
		name  string
		quiet time.Duration // how long the clients have been quiet when the publisher comes
		taken bool
	}{
		{"quiet for bind_idle_displace_after", after, true},
		{"quiet for much longer", 100 * after, true},
		{"quiet for a nanosecond less", after - time.Nanosecond, false},
		{"just arrived", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := DefaultConfig()
			cfg.MaxBindConnections, cfg.BindIdleDisplaceAfter = 2, after
			l, addr := boundWorker(t, cfg)
			for i := range cfg.MaxBindConnections {
				_, err := dialZMTP(t, addr, zmtpReady("PUB"))
				require.NoError(t, err, "quiet client %d, within the cap, was refused", i+1)
			}
			l.clock.Advance(tt.quiet)
			// The place is made, or the newcomer refused, before its handshake: the
			// counts are final once NewPublisher returns.
			p, err := NewPublisher(PublisherConfig{Endpoint: "tcp://" + addr, Connect: true})
			displaced := testutil.ToFloat64(l.m.metrics.displacedConns.WithLabelValues("w"))
			refused := testutil.ToFloat64(l.m.metrics.refusedConns.WithLabelValues("w"))
			if !tt.taken {
				assert.Error(t, err, "the publisher took the place of a client quiet for less than bind_idle_displace_after")
				assert.Equal(t, 0.0, displaced)
				assert.Equal(t, 1.0, refused)
				return
			}
			require.NoError(t, err, "the quiet clients locked the publisher out")
			t.Cleanup(p.Close)
			assert.Equal(t, 1.0, displaced)
			assert.Equal(t, 0.0, refused)
			waitSubscribed(t, p)
			require.NoError(t, p.Publish(&Batch{Events: []Event{blockAt(0)}}))
			l.waitOverlap("w", toks(0, testBS), 1)
		})
	}
}

// TestABoundEndpointDisplacesTheConnectionQuietLongest: of the connections quiet for
// bind_idle_displace_after, the newcomer takes the place of the one whose last message
// (or, without one, its arrival) is oldest, whatever the order they came in; and only
// that one's.
func TestABoundEndpointDisplacesTheConnectionQuietLongest(t *testing.T) {
	const after = 10 * time.Second
	cfg := DefaultConfig()
	cfg.MaxBindConnections, cfg.BindIdleDisplaceAfter = 3, after
	l, addr := boundWorker(t, cfg)
	conns := map[string]net.Conn{}
	for _, name := range []string{"a", "b", "c"} {
		conn, err := dialZMTP(t, addr, zmtpReady("PUB"))
		require.NoError(t, err, "client %s, within the cap, was refused", name)
		conns[name] = conn
	}
	decodeErrors := func() float64 { return testutil.ToFloat64(l.m.metrics.decodeErrors.WithLabelValues("w")) }
	// A message (here one the subscriber cannot read: what counts is that it arrived)
	// ends a client's quiet, a command does not; the clock moves only once the
	// subscriber has it.
	send := func(name string, frame []byte) {
		t.Helper()
		want := decodeErrors() + 1
		_, err := conns[name].Write(frame)
		require.NoError(t, err)
		require.Eventually(t, func() bool { return decodeErrors() == want }, waitFor, tick, "%s's frame never arrived", name)
	}
	// b sends only a command (zmq4 hands it on, as a message the subscriber cannot
	// read), a a message 1 s after the three came, c 2 s after: quiet longest are b,
	// then a, then c.
	l.clock.Advance(time.Second)
	send("a", zmtpFrame(0x00, []byte("not a KV events message")))
	l.clock.Advance(time.Second / 2)
	send("b", zmtpFrame(0x04, zmtpCommand("PING", []byte{0, 0})))
	l.clock.Advance(time.Second / 2)
	send("c", zmtpFrame(0x00, []byte("not a KV events message")))
	l.clock.Advance(after) // c has been quiet for exactly bind_idle_displace_after
	for i, name := range []string{"b", "a", "c"} {
		_, err := dialZMTP(t, addr, zmtpReady("PUB"))
		require.NoError(t, err, "newcomer %d was refused", i+1)
		assert.Equal(t, float64(i+1), testutil.ToFloat64(l.m.metrics.displacedConns.WithLabelValues("w")), "connections displaced by newcomer %d", i+1)
		assert.True(t, closedByServer(t, conns[name]), "newcomer %d did not take the place of %s, the connection quiet longest", i+1, name)
	}
	// The newcomers have just come: the next one is refused.
	conn, err := dialZMTP(t, addr, zmtpReady("PUB"))
	if err == nil {
		assert.True(t, closedByServer(t, conn), "a newcomer to an endpoint whose clients have just come was kept")
	}
	assert.Equal(t, 1.0, testutil.ToFloat64(l.m.metrics.refusedConns.WithLabelValues("w")))
	assert.Equal(t, 3.0, testutil.ToFloat64(l.m.metrics.displacedConns.WithLabelValues("w")))
}

// TestADisplacedPublisherThatReconnectsResumes: an engine idle for
// bind_idle_displace_after loses its place to a newcomer, reconnects (as a ZMQ
// connecting socket does by itself) and takes the place of a quiet client in turn.
// What it published in between never arrived: with a replay endpoint the rejoin
// replays it; without one the gap clears the worker's entries, which its later
// batches rebuild (under-reported, never stale).
func TestADisplacedPublisherThatReconnectsResumes(t *testing.T) {
	const after = 10 * time.Second
	tests := []struct {
		name   string
		replay bool
	}{
		{"with a replay endpoint", true},
		{"without one", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := DefaultConfig()
			cfg.MaxBindConnections, cfg.BindIdleDisplaceAfter = 2, after
			replay := ""
			if tt.replay {
				replay = fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
			}
			l, addr := boundWorkerReplaying(t, cfg, replay)
			p := newPublisher(t, PublisherConfig{Endpoint: "tcp://" + addr, Connect: true, ReplayEndpoint: replay})
			waitSubscribed(t, p)
			require.NoError(t, p.Publish(&Batch{Events: []Event{blockAt(0)}}))
			require.NoError(t, p.Publish(&Batch{Events: []Event{blockAt(1)}}))
			l.waitOverlap("w", toks(10, testBS), 1)

			// A client comes 1 s after the engine's last batch and stays quiet; when a
			// newcomer finds the endpoint full, the idle engine has been quiet longest.
			l.clock.Advance(time.Second)
			quiet, err := dialZMTP(t, addr, zmtpReady("PUB"))
			require.NoError(t, err)
			l.clock.Advance(after)
			_, err = dialZMTP(t, addr, zmtpReady("PUB"))
			require.NoError(t, err, "the newcomer was refused")
			require.Eventually(t, func() bool { return !p.Subscribed() }, waitFor, tick, "the idle engine kept its place")

			// Published while it was out: lost on the way.
			require.NoError(t, p.PublishPayload(mustEncode(t, p.cfg.Form, blockAt(2)), false))
			redial(t, p)
			assert.True(t, closedByServer(t, quiet), "the reconnecting engine did not take the quiet client's place")
			assert.Equal(t, 2.0, testutil.ToFloat64(l.m.metrics.displacedConns.WithLabelValues("w")))
			waitSubscribed(t, p)
			require.NoError(t, p.Publish(&Batch{Events: []Event{blockAt(3)}}))
			l.waitOverlap("w", toks(30, testBS), 1)

			if tt.replay {
				// The replay delivers the last batch too, so its blocks can show before
				// the replay (and the gap) is counted.
				require.Eventually(t, func() bool { return testutil.ToFloat64(l.m.metrics.replays.WithLabelValues("w", "ok")) == 1 },
					waitFor, tick, "the reconnection's replay")
				assert.Equal(t, 1.0, testutil.ToFloat64(l.m.metrics.gaps.WithLabelValues("w")))
				assert.Equal(t, 1, l.overlap("w", toks(20, testBS)), "the batch published while the engine was out was replayed")
				assert.Equal(t, 1, l.overlap("w", toks(0, testBS)), "the entries from before were kept")
				assert.Equal(t, 0.0, testutil.ToFloat64(l.m.metrics.resets.WithLabelValues("w", reasonGap)))
				return
			}
			assert.Equal(t, 1.0, testutil.ToFloat64(l.m.metrics.gaps.WithLabelValues("w")))
			assert.Equal(t, 0, l.overlap("w", toks(20, testBS)), "a batch that never arrived")
			assert.Equal(t, 0, l.overlap("w", toks(0, testBS)), "the entries from before the gap were kept, though a removal may have been lost")
			assert.Equal(t, 1.0, testutil.ToFloat64(l.m.metrics.resets.WithLabelValues("w", reasonGap)))
		})
	}
}

// redial gives p a new connection to its endpoint, as a ZMQ connecting socket makes
// after losing one (zmq4's does not redial by itself); its numbering and its replay
// buffer go on.
func redial(t *testing.T, p *Publisher) {
	t.Helper()
	sock := zmq4.NewPub(context.Background(), zmq4.WithLogger(discardLogger()))
	if err := sock.Dial(p.cfg.Endpoint); err != nil {
		_ = sock.Close()
		require.NoError(t, err, "the engine's reconnection was refused")
	}
	p.mu.Lock()
	old := p.pub
	p.pub = sock
	p.mu.Unlock()
	_ = old.Close()
}
