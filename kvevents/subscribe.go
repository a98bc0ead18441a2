package kvevents

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute/internal/background"
)

const (
	backoffMin  = 100 * time.Millisecond
	dialTimeout = 2 * time.Second
)

// subscriber keeps one rank's SUB socket connected (or bound) and feeds its messages
// to the rank's stream until ctx ends.
type subscriber struct {
	stream   *stream
	guard    background.Guard // each message's
	endpoint string           // as configured (tcp:// or ipc://)
	bind     bool
	topic    string
	backoff  time.Duration // the cap
	// maxConns caps a bound socket's connections (kv_events.max_bind_connections);
	// displaceAfter is how long one must have been quiet for a newcomer to take its
	// place when the socket is full (kv_events.bind_idle_displace_after).
	maxConns      int
	displaceAfter time.Duration
	now           func() time.Time
	log           *slog.Logger
	zmqLog        *log.Logger

	// down is when the connection was lost (unix ns), 0 while connected. Bound
	// sockets cannot tell whether a publisher is connected: they are never down.
	down atomic.Int64
	// fresh is set when zmq4 accepts a connection of the socket (the dialled one, or
	// one a publisher made to the bound one), and passed on to the stream with the
	// next message, which may be the first of a restarted publisher.
	fresh atomic.Bool
}

func (s *subscriber) run(ctx context.Context) {
	s.down.Store(s.now().UnixNano())
	ep, err := limitedEndpoint(s.endpoint)
	if err != nil {
		s.log.Error("kv events: endpoint", "error", err)
		return
	}
	opts := socketOptions{established: func() { s.fresh.Store(true) }}
	if s.bind {
		opts.maxConns, opts.displaceAfter, opts.now = s.maxConns, s.displaceAfter, s.now
		opts.refused = func() {
			s.stream.metrics.refusedConn(s.stream.a.spec.Name)
			s.log.Debug("kv events: connection refused: the bound endpoint holds kv_events.max_bind_connections already, none of them quiet for kv_events.bind_idle_displace_after",
				"endpoint", s.endpoint)
		}
		opts.displaced = func(peer net.Addr, quiet time.Duration) {
			s.stream.metrics.displacedConn(s.stream.a.spec.Name)
			s.log.Info("kv events: closed the bound endpoint's connection quiet longest to take a new one (a publisher among them reconnects)",
				"endpoint", s.endpoint, "peer", peer.String(), "quiet", quiet)
		}
	}
	sockCtx := withSocketOptions(ctx, opts)
	wait := backoffMin
	for ctx.Err() == nil {
		sock := zmq4.NewSub(sockCtx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(dialTimeout), zmq4.WithLogger(s.zmqLog))
		// err is the loop's, not the if statement's: a failed dial or bind taken for a
		// connection left the subscriber waiting on a socket with none, for good.
		if err = sock.SetOption(zmq4.OptionSubscribe, s.topic); err == nil {
			if s.bind {
				err = sock.Listen(ep)
			} else {
				err = sock.Dial(ep)
			}
		}
		if err != nil {
			_ = sock.Close()
			s.log.Debug("kv events: cannot reach the publisher", "endpoint", s.endpoint, "error", err, "retry_in", wait)
			if !sleep(ctx, wait) {
				return
			}
			wait = min(2*wait, s.backoff)
			continue
		}
		wait = backoffMin
		s.down.Store(0)
		s.log.Info("kv events: subscribed", "endpoint", s.endpoint, "bind", s.bind)
		s.receive(ctx, sock)
		closeAndDrain(sock)
		if ctx.Err() == nil {
			s.down.Store(s.now().UnixNano())
			s.log.Warn("kv events: connection lost", "endpoint", s.endpoint)
			// A restarting engine is not hammered; and a publisher that is closing
			// its listener gets the time to, so kvroute does not handshake with a
			// socket about to vanish.
			if !sleep(ctx, backoffMin) {
				return
			}
		}
	}
}

// receiver is what receive reads of a socket.
type receiver interface {
	Recv() (zmq4.Msg, error)
}

// receive reads messages until the connection (connect mode) or the socket ends.
func (s *subscriber) receive(ctx context.Context, sock receiver) {
	for {
		msg, err := sock.Recv()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if errors.As(err, new(errMessageTooLarge)) {
				s.stream.metrics.decodeError(s.stream.a.spec.Name)
				s.log.Warn("kv events: message over the size limit; connection closed", "endpoint", s.endpoint, "error", err)
			}
			if s.bind {
				// One publisher's connection ended; the bound socket still listens.
				s.log.Debug("kv events: a publisher's connection ended", "endpoint", s.endpoint, "error", err)
				continue
			}
			return
		}
		s.handle(ctx, msg.Frames)
	}
}

// handle parses one message and hands it to the stream. A message whose handling
// panics (a bug its bytes reached, in the parser, the decoder, the applier or the
// index) is recovered, logged and counted (kvroute_background_panics_total{loop=
// "kv_events"}), and is lost as an undecodable batch is: its events may be half
// applied, so the worker's event entries are cleared (resets reason "panic"), and the
// batches that follow rebuild them.
func (s *subscriber) handle(ctx context.Context, frames [][]byte) {
	err := s.guard.Do(func() error {
		m, err := ParseMessage(frames)
		if err != nil {
			s.stream.metrics.decodeError(s.stream.a.spec.Name)
			s.log.Warn("kv events: not a KV events message", "endpoint", s.endpoint, "error", err)
			return nil
		}
		if s.fresh.Swap(false) {
			s.stream.reconnected = true
		}
		s.stream.onMessage(ctx, m)
		return nil
	})
	if err != nil {
		// The clearing is guarded too: a panic there (the index's, in the state the first
		// one left) is counted and logged again, and the stream goes on. The worker's
		// entries may then stay, read as held until the engine's removals or their TTL:
		// a worse guess of its cache, while its requests are still routed.
		_ = s.guard.Do(func() error {
			s.stream.lost()
			return nil
		})
	}
}

// downSince reports since when the connection has been lost.
func (s *subscriber) downSince() (time.Time, bool) {
	ns := s.down.Load()
	if ns == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, ns), true
}

// newReplayer returns the replay client of one rank: a DEALER that sends
// ["", start] to the engine's ROUTER and reads replies until the end marker, in
// either layout, within timeout.
func newReplayer(endpoint string, timeout time.Duration, zmqLog *log.Logger) replayFunc {
	return func(ctx context.Context, from uint64, each func(Message)) error {
		ep, err := limitedEndpoint(endpoint)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		sock := zmq4.NewDealer(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(dialTimeout), zmq4.WithLogger(zmqLog))
		defer closeAndDrain(sock)
		if err := sock.Dial(ep); err != nil {
			return err
		}
		if err := sock.SendMulti(zmq4.NewMsgFrom(ReplayRequest(from)...)); err != nil {
			return err
		}
		for {
			msg, err := sock.Recv()
			if err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("replay from %d: %w", from, ctx.Err())
				}
				return err
			}
			m, end, err := ParseReplay(msg.Frames)
			if err != nil {
				return err
			}
			if end {
				return nil
			}
			each(m)
		}
	}
}

// closeAndDrain closes a socket and empties its queue. zmq4 reads each connection into
// the socket's queue (10 messages) from a goroutine that blocks while the queue is
// full, without looking at the socket's context: a socket closed with a full queue
// leaves that goroutine, and the messages it holds (up to maxMessageBytes each),
// blocked for good. Once the socket is closed only those goroutines add to the queue,
// each one message, and a Recv returns a queued message or the closed context's error
// at random; so many errors in a row mean the queue is empty and stays so.
func closeAndDrain(sock zmq4.Socket) {
	_ = sock.Close()
	for misses := 0; misses < 64; {
		if _, err := sock.Recv(); errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			misses++
		} else {
			misses = 0
		}
	}
}

// discardLogger silences zmq4's own logging; kvroute logs what matters.
func discardLogger() *log.Logger { return log.New(io.Discard, "", 0) }

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
