package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

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
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	w := router.Worker{Name: "w", Address: "127.0.0.1:1", Models: []string{testModel},
		KVEvents: &router.KVEvents{Endpoint: "tcp://" + addr, Bind: true}}
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
