package kvevents

import (
	"context"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/router"
)

// mute is a loopback TCP listener that takes connections and never speaks ZMTP: an
// engine that hangs, or a port that is not a ZMQ socket. Its connections come out of
// conns as they are accepted.
func mute(t *testing.T) (addr string, conns <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	c := make(chan net.Conn, 16)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case c <- conn:
			default:
				t.Cleanup(func() { _ = conn.Close() })
			}
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		for {
			select {
			case conn := <-c:
				_ = conn.Close()
			default:
				return
			}
		}
	})
	return "tcp://" + ln.Addr().String(), c
}

// greeted waits for a connection to the mute listener and reads the dialler's ZMTP
// greeting from it: the dialler then waits for the greeting in return.
func greeted(t *testing.T, conns <-chan net.Conn) net.Conn {
	t.Helper()
	var conn net.Conn
	select {
	case conn = <-conns:
	case <-time.After(waitFor):
		t.Fatal("nobody dialled")
	}
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(waitFor)))
	_, err := io.ReadFull(conn, make([]byte, 64))
	require.NoError(t, err, "no ZMTP greeting")
	return conn
}

// within runs f and fails the test when it has not returned after d.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { f(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %s", what, d)
	}
}

// TestStoppingASubscriberInTheHandshakeReturns: an engine that takes the TCP
// connection and never sends its ZMTP greeting (a hung process: the kernel still
// accepts) held the subscriber in zmq4's handshake, which no context interrupts, so
// removing the worker (SetWorkers) and shutting down waited forever.
func TestStoppingASubscriberInTheHandshakeReturns(t *testing.T) {
	addr, conns := mute(t)
	w := router.Worker{Name: "w", Address: "127.0.0.1:1", Models: []string{testModel},
		KVEvents: &router.KVEvents{Endpoint: addr}}
	l := startLive(t, DefaultConfig(), w)
	greeted(t, conns)
	within(t, dialTimeout/2, "SetWorkers removing a worker stuck in the handshake", func() { l.m.SetWorkers(nil) })
}

// TestAReplayStuckInTheHandshakeEndsAtItsTimeout: replay_timeout bounds the whole
// replay, the handshake with a replay endpoint that never answers included.
func TestAReplayStuckInTheHandshakeEndsAtItsTimeout(t *testing.T) {
	addr, _ := mute(t)
	replay := newReplayer(addr, 100*time.Millisecond, discardLogger())
	var err error
	within(t, dialTimeout/2, "a replay from a mute endpoint", func() {
		err = replay(context.Background(), 0, func(Message) {})
	})
	require.Error(t, err)
}

// TestAFailedHandshakeClosesItsConnection: a connection whose ZMTP handshake fails
// (not a ZMQ socket, a wrong port) is closed. zmq4 abandons it without closing, and
// the subscriber dials again after each failure, so every attempt leaked a socket
// for as long as the worker stayed configured.
func TestAFailedHandshakeClosesItsConnection(t *testing.T) {
	addr, conns := mute(t)
	w := router.Worker{Name: "w", Address: "127.0.0.1:1", Models: []string{testModel},
		KVEvents: &router.KVEvents{Endpoint: addr}}
	startLive(t, DefaultConfig(), w)
	var conn net.Conn
	select {
	case conn = <-conns:
	case <-time.After(waitFor):
		t.Fatal("the subscriber never dialled")
	}
	// An HTTP server's answer to the greeting: not a ZMTP signature.
	_, err := io.WriteString(conn, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(waitFor)))
	_, err = io.Copy(io.Discard, conn) // the subscriber's greeting, then its close
	if err != nil {
		// Closed with the answer's tail unread: a reset, still a close.
		require.ErrorIs(t, err, syscall.ECONNRESET, "the subscriber never closed the connection of its failed handshake")
	}
}

// TestAMuteClientDoesNotBlockABoundEndpoint: in bind mode zmq4 accepts and handshakes
// one connection at a time, so one client that connects and never speaks (a port
// scanner, a hung engine) kept every publisher out for good.
func TestAMuteClientDoesNotBlockABoundEndpoint(t *testing.T) {
	port := freePort(t)
	ep := fmt.Sprintf("tcp://127.0.0.1:%d", port)
	w := router.Worker{Name: "w", Address: "127.0.0.1:1", Models: []string{testModel},
		KVEvents: &router.KVEvents{Endpoint: ep, Bind: true}}
	l := startLive(t, DefaultConfig(), w)
	var mute net.Conn
	require.Eventually(t, func() bool {
		var err error
		mute, err = net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		return err == nil
	}, waitFor, 10*tick, "kvroute never bound its endpoint")
	t.Cleanup(func() { _ = mute.Close() })

	// A publisher dialling in after the mute client.
	type result struct {
		p   *Publisher
		err error
	}
	got := make(chan result, 1)
	go func() {
		p, err := NewPublisher(PublisherConfig{Endpoint: ep, Connect: true})
		got <- result{p, err}
	}()
	var p *Publisher
	select {
	case r := <-got:
		require.NoError(t, r.err)
		p = r.p
	case <-time.After(4 * dialTimeout):
		t.Fatal("the publisher's handshake never completed: the bound endpoint is stuck with the mute client")
	}
	t.Cleanup(p.Close)
	waitSubscribed(t, p)
	require.NoError(t, p.Publish(&Batch{Events: []Event{blockAt(0)}}))
	l.waitOverlap("w", toks(0, testBS), 1)
}

// TestASubscriberKeepsDiallingAnEngineThatRefusesIt: the error of a failed dial (or
// bind) was assigned to a variable shadowed in its if statement, so the subscriber
// logged "subscribed", marked the stream connected and waited on a socket with no
// connection, for good: an engine not up yet when kvroute started, or slower to come
// back from a restart than the first redial, was never subscribed to, and the silence
// watchdog never saw the stream as broken.
func TestASubscriberKeepsDiallingAnEngineThatRefusesIt(t *testing.T) {
	addr, conns := mute(t) // it takes each connection and closes it: the handshake fails
	w := router.Worker{Name: "w", Address: "127.0.0.1:1", Models: []string{testModel},
		KVEvents: &router.KVEvents{Endpoint: addr}}
	l := startLive(t, DefaultConfig(), w)
	for i := range 3 {
		select {
		case conn := <-conns:
			_ = conn.Close()
		case <-time.After(waitFor):
			t.Fatalf("the subscriber gave up after %d attempts", i)
		}
	}
	_, down := l.m.workers["w"].subs[0].downSince()
	assert.True(t, down, "a subscriber that never shook hands counts as connected")
}
