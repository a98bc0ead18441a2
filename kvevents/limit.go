package kvevents

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// maxMessageBytes caps one ZMQ message (all its frames). zmq4 allocates each frame at
// the size its header declares, so a hostile peer could otherwise make kvroute
// allocate up to 2^63 bytes; vLLM's largest batches are a few MB.
const maxMessageBytes = 64 << 20

// zmq4 picks a transport by the endpoint's scheme from a registry of its own; kvroute
// registers size-limited twins of tcp and ipc there once, and dials and binds through
// them.
var registerLimited sync.Once

// limitedEndpoint returns endpoint with its scheme replaced by the size-limited twin.
func limitedEndpoint(endpoint string) (string, error) {
	registerLimited.Do(func() {
		_ = zmq4.RegisterTransport("kvroute-tcp", limitedTransport{inner: transport.New("tcp"), max: maxMessageBytes})
		_ = zmq4.RegisterTransport("kvroute-ipc", limitedTransport{inner: transport.New("unix"), max: maxMessageBytes})
	})
	scheme, rest, ok := strings.Cut(endpoint, "://")
	if !ok || (scheme != "tcp" && scheme != "ipc") {
		return "", fmt.Errorf("kvevents: endpoint %q: want tcp:// or ipc://", endpoint)
	}
	return "kvroute-" + scheme + "://" + rest, nil
}

// limitedTransport wraps a zmq4 transport so every connection refuses a message
// larger than max before zmq4 allocates it.
type limitedTransport struct {
	inner transport.Transport
	max   int
}

func (t limitedTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := t.inner.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	opts, _ := ctx.Value(socketOptionsKey{}).(socketOptions)
	return newLimitedConn(ctx, c, t.max, connHooks{accepted: opts.established}), nil
}

func (t limitedTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := t.inner.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	opts, _ := ctx.Value(socketOptionsKey{}).(socketOptions)
	ll := &limitedListener{Listener: l, max: t.max, ctx: ctx, opts: opts, open: map[*limitedConn]struct{}{}}
	ll.base = ll.now()
	return ll, nil
}

func (t limitedTransport) Addr(ep string) (string, error) { return t.inner.Addr(ep) }

// socketOptions are what the limited transport applies to one zmq4 socket's
// connections. zmq4 hands a transport nothing of the socket but its context, so they
// travel in it ([withSocketOptions]); a socket without them gets the zero value.
type socketOptions struct {
	// maxConns caps a bound socket's open connections (0: no cap): each can hold a
	// message of up to maxMessageBytes, so the cap bounds the socket's memory, at
	// (queue of 10 + maxConns) such messages. A connection beyond it takes the place of
	// the one quiet longest if that one has been quiet for displaceAfter (see
	// [limitedListener.admit]); otherwise it is closed on arrival, and refused (if set)
	// is called. A byte budget shared by the connections would bound memory tighter,
	// but a peer holding its share (a message sent slowly) would then hold up the
	// engine's own connection; the cap turns away only newcomers, and the engine's
	// connection is normally the first.
	maxConns int
	refused  func()
	// displaceAfter is how long a bound socket's connection must have gone without
	// delivering a message (since it was accepted, or since its last message) before a
	// newcomer may take its place when the socket is full (0: never). displaced (if
	// set) is called with the closed connection's peer and how long it was quiet,
	// before the peer can see the close.
	displaceAfter time.Duration
	displaced     func(peer net.Addr, quiet time.Duration)
	// now is the clock of quietness (nil: time.Now).
	now func() time.Time
	// established, if set, is called when zmq4 accepts a connection of the socket
	// (dialled or bound) after its handshake, before it reads the connection's first
	// message.
	established func()
}

type socketOptionsKey struct{}

// withSocketOptions returns ctx carrying o, for a zmq4 socket made with it.
func withSocketOptions(ctx context.Context, o socketOptions) context.Context {
	return context.WithValue(ctx, socketOptionsKey{}, o)
}

type limitedListener struct {
	net.Listener
	max  int
	ctx  context.Context // the socket's
	opts socketOptions
	// base is when the listener started, by opts.now: connections' quietSince counts
	// from it, so that a wall clock set back or forward does not shift them (time.Now's
	// readings differ by the monotonic clock).
	base time.Time

	mu   sync.Mutex
	open map[*limitedConn]struct{} // connections accepted and not closed yet
}

// Accept returns the next connection the endpoint has room for ([limitedListener.admit]),
// closing those it has none for. zmq4 accepts and shakes hands one connection at a
// time, so only this goroutine adds to open.
func (l *limitedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if !l.admit() {
			if l.opts.refused != nil {
				l.opts.refused() // before the peer can see the close
			}
			_ = c.Close()
			continue
		}
		// Made under the lock, so that a Close before it is in open (its handshake
		// timer's) waits to take it out.
		l.mu.Lock()
		lc := newLimitedConn(l.ctx, c, l.max, connHooks{release: l.forget, accepted: l.opts.established, clock: l.clock})
		l.open[lc] = struct{}{}
		l.mu.Unlock()
		return lc, nil
	}
}

// admit reports whether the endpoint has room for one more connection. When it holds
// maxConns already, the connection that has gone longest without delivering a message
// is closed to make room, provided that is displaceAfter or more: otherwise a client
// that shook hands and then went quiet held its place for good, and maxConns of them
// (bind mode has no authentication) locked out a restarted engine. A serving engine
// publishes a batch whenever it stores or removes blocks, so it is rarely quiet for
// long; an idle one that is displaced has nothing to report, and reconnects by itself
// (a ZMQ connecting socket does), its next batch then checked against its replay like
// any reconnection's ([stream.rejoin]).
func (l *limitedListener) admit() bool {
	if l.opts.maxConns <= 0 {
		return true
	}
	l.mu.Lock()
	if len(l.open) < l.opts.maxConns {
		l.mu.Unlock()
		return true
	}
	var quietest *limitedConn
	var since int64
	if l.opts.displaceAfter > 0 {
		for c := range l.open {
			if s := c.quietSince.Load(); quietest == nil || s < since {
				quietest, since = c, s
			}
		}
	}
	l.mu.Unlock()
	if quietest == nil {
		return false
	}
	quiet := time.Duration(l.clock() - since)
	if quiet < l.opts.displaceAfter {
		return false
	}
	// Closed by itself meanwhile, it freed its place all the same (and was not
	// displaced); only this goroutine adds to open, so there is room either way.
	if quietest.markClosed(func() {
		if l.opts.displaced != nil {
			l.opts.displaced(quietest.RemoteAddr(), quiet)
		}
	}) {
		_ = quietest.Conn.Close()
	}
	return true
}

// forget frees a closed connection's place.
func (l *limitedListener) forget(c *limitedConn) {
	l.mu.Lock()
	delete(l.open, c)
	l.mu.Unlock()
}

func (l *limitedListener) now() time.Time {
	if l.opts.now != nil {
		return l.opts.now()
	}
	return time.Now()
}

// clock reads the time since base, in ns: the clock of connections' quietSince.
func (l *limitedListener) clock() int64 { return int64(l.now().Sub(l.base)) }

// errMessageTooLarge is what a limited connection's Read returns for an oversized
// message: zmq4 closes the connection and the subscriber counts a decode error.
type errMessageTooLarge struct{ size uint64 }

func (e errMessageTooLarge) Error() string {
	return fmt.Sprintf("kvevents: ZMQ message of at least %d bytes, over the %d-byte limit", e.size, maxMessageBytes)
}

// limitedConn follows ZMTP 3 framing (a 64-byte greeting, then frames of a flags byte,
// a 1- or 8-byte size and a body) on the bytes read, and fails the read that brings a
// frame header taking the current message past max. It parses only the headers, and
// the peer's READY ([checkReady]): the other bodies pass through untouched.
type limitedConn struct {
	net.Conn
	max      uint64
	greeting int    // greeting bytes still to pass
	state    int    // what the next byte is: flags, size or body
	flags    byte   // current frame's flags
	sizeLeft int    // size bytes still to read
	size     uint64 // current frame's size, as read so far
	body     uint64 // body bytes still to pass
	message  uint64 // bytes of the current message so far, with a per-frame overhead
	err      error
	// answered is set once the peer's first message after the greeting (its READY)
	// has passed; ready holds its body until then.
	answered bool
	ready    []byte
	// handshake closes the connection unless zmq4 accepts it within handshakeTimeout;
	// nil once it has.
	handshake *time.Timer
	unwatch   func() bool // stops closing the connection when its socket's context ends
	hooks     connHooks
	closed    atomic.Bool
	// quietSince is when the connection was accepted or last delivered a whole message,
	// by hooks.clock, for a bound socket's [limitedListener.admit]; kept only with one.
	// A message counts once its last frame has arrived, so a peer that trickles one
	// endless message stays quiet.
	quietSince atomic.Int64
}

// connHooks are called by a limited connection; a nil one is not.
type connHooks struct {
	release  func(*limitedConn) // once, when it is closed
	accepted func()             // once, when zmq4 accepts it after its handshake
	clock    func() int64       // the clock of quietSince (ns)
}

// handshakeTimeout bounds a connection's ZMTP handshake. zmq4 sets no deadline on
// it (a peer that never answers holds the dialling socket, or a bound socket's accept
// loop, for good) and abandons a connection whose handshake fails without closing it:
// a bad greeting, and also a READY it refuses (a socket type SUB or DEALER does not
// pair with, a command other than READY). The handshake therefore ends not at the
// peer's READY but when zmq4 reads on past it, which it does only from the reader it
// starts for a connection it accepted: it reads exactly the bytes of each frame, so
// the first read after the READY message is that reader's.
const handshakeTimeout = dialTimeout

const (
	stateFlags = iota
	stateSize
	stateBody
)

// frameOverhead charges each frame for its slice header in zmq4, so a flood of empty
// frames counts against the limit too.
const frameOverhead = 32

// newLimitedConn wraps c, which is closed when ctx (its zmq4 socket's) ends or its
// handshake does not complete in time: zmq4 interrupts neither itself.
func newLimitedConn(ctx context.Context, c net.Conn, max int, hooks connHooks) *limitedConn {
	lc := &limitedConn{Conn: c, max: uint64(max), greeting: 64, unwatch: func() bool { return false }, hooks: hooks}
	if ctx != nil {
		lc.unwatch = context.AfterFunc(ctx, func() { _ = c.Close() })
	}
	if hooks.clock != nil {
		lc.quietSince.Store(hooks.clock())
	}
	lc.handshake = time.AfterFunc(handshakeTimeout, func() { _ = lc.Close() })
	return lc
}

// Close closes the connection, stops watching its socket's context (so that a bound
// socket's context does not keep every connection it ever accepted) and frees its
// place.
func (c *limitedConn) Close() error {
	c.markClosed(nil)
	return c.Conn.Close()
}

// markClosed does the first Close's bookkeeping, calling before (if set) first; it
// reports whether this was the first.
func (c *limitedConn) markClosed(before func()) bool {
	if !c.closed.CompareAndSwap(false, true) {
		return false
	}
	if before != nil {
		before()
	}
	c.unwatch()
	if c.hooks.release != nil {
		c.hooks.release(c)
	}
	return true
}

func (c *limitedConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if c.answered && c.handshake != nil { // zmq4 accepted the connection
		c.handshake.Stop()
		c.handshake = nil
		if c.hooks.accepted != nil {
			c.hooks.accepted()
		}
	}
	n, err := c.Conn.Read(p)
	if perr := c.scan(p[:n]); perr != nil {
		err, n = perr, 0
		c.err = perr
	}
	if err != nil {
		// zmq4 closes a connection whose read fails, but not during the handshake: a
		// client gone before it shook hands kept its place until the handshake timer.
		_ = c.Close()
	}
	return n, err
}

func (c *limitedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil {
		_ = c.Close() // as for Read
	}
	return n, err
}

func (c *limitedConn) scan(b []byte) error {
	for len(b) > 0 {
		if c.greeting > 0 {
			k := min(c.greeting, len(b))
			c.greeting -= k
			b = b[k:]
			continue
		}
		switch c.state {
		case stateFlags:
			c.flags, b = b[0], b[1:]
			if !c.answered && c.flags&0x05 != 0x04 {
				return errBadReady("the peer's first message is not one command frame")
			}
			c.size, c.sizeLeft, c.state = 0, 1, stateSize
			if c.flags&0x02 != 0 { // LONG
				c.sizeLeft = 8
			}
		case stateSize:
			c.size = c.size<<8 | uint64(b[0])
			b = b[1:]
			if c.sizeLeft--; c.sizeLeft > 0 {
				continue
			}
			c.message += c.size + frameOverhead
			if c.size > c.max || c.message > c.max {
				return errMessageTooLarge{size: c.message}
			}
			if !c.answered && c.size > maxReadyBytes {
				return errBadReady(fmt.Sprintf("a READY of %d bytes, over %d", c.size, maxReadyBytes))
			}
			c.body, c.state = c.size, stateBody
			if c.body == 0 {
				if err := c.endFrame(); err != nil {
					return err
				}
			}
		case stateBody:
			k := uint64(len(b))
			if k > c.body {
				k = c.body
			}
			if !c.answered {
				c.ready = append(c.ready, b[:k]...)
			}
			c.body -= k
			b = b[k:]
			if c.body == 0 {
				if err := c.endFrame(); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (c *limitedConn) endFrame() error {
	c.state = stateFlags
	if c.flags&0x01 != 0 { // more frames of this message follow
		return nil
	}
	c.message = 0
	if c.answered {
		if c.flags&0x04 == 0 && c.hooks.clock != nil { // a message, not a command (PING, …)
			c.quietSince.Store(c.hooks.clock())
		}
		return nil
	}
	c.answered = true
	err := checkReady(c.ready)
	c.ready = nil
	return err
}
