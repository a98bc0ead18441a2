package kvevents

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/go-zeromq/zmq4"
)

// PublisherConfig configures a [Publisher].
type PublisherConfig struct {
	// Endpoint is the PUB endpoint: bound (tcp://127.0.0.1:0 picks a port), or dialled
	// when Connect is set (a consumer that binds).
	Endpoint string
	Connect  bool
	// ReplayEndpoint, when set, is bound with a ROUTER socket answering replay requests.
	ReplayEndpoint string
	Topic          string
	Form           Form
	ReplayLayout   ReplayLayout
	// Buffer is how many batches replay can return (vLLM keeps 10,000); 0 means that.
	Buffer int
}

// Publisher publishes KV event batches as vLLM does: `[topic, seq, payload]` on a PUB
// socket, seq counting batches from 0, the last Buffer batches replayable from a
// ROUTER socket. The simulated workers publish through it. Safe for concurrent use.
type Publisher struct {
	cfg    PublisherConfig
	pub    zmq4.Socket
	router zmq4.Socket
	cancel context.CancelFunc
	done   sync.WaitGroup

	mu     sync.Mutex
	seq    uint64
	buffer []buffered // ring of the last cfg.Buffer batches
	next   int
}

type buffered struct {
	seq     uint64
	payload []byte
}

// NewPublisher binds (or dials) its sockets.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if cfg.Buffer <= 0 {
		cfg.Buffer = 10_000
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{cfg: cfg, cancel: cancel}
	p.pub = zmq4.NewPub(ctx, zmq4.WithLogger(discardLogger()))
	var err error
	if cfg.Connect {
		err = p.pub.Dial(cfg.Endpoint)
	} else {
		err = p.pub.Listen(cfg.Endpoint)
	}
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("kvevents: publisher endpoint %s: %w", cfg.Endpoint, err)
	}
	if cfg.ReplayEndpoint != "" {
		p.router = zmq4.NewRouter(ctx, zmq4.WithLogger(discardLogger()))
		if err := p.router.Listen(cfg.ReplayEndpoint); err != nil {
			p.Close()
			return nil, fmt.Errorf("kvevents: publisher replay endpoint %s: %w", cfg.ReplayEndpoint, err)
		}
		p.done.Go(p.serveReplay)
	}
	return p, nil
}

// Addr returns the PUB socket's bound endpoint (with the port picked for :0), or the
// configured one when it dials.
func (p *Publisher) Addr() string { return endpointOf(p.pub, p.cfg.Endpoint) }

// ReplayAddr returns the replay socket's bound endpoint, or "".
func (p *Publisher) ReplayAddr() string {
	if p.router == nil {
		return ""
	}
	return endpointOf(p.router, p.cfg.ReplayEndpoint)
}

func endpointOf(s zmq4.Socket, configured string) string {
	if a := s.Addr(); a != nil {
		scheme, _, _ := strings.Cut(configured, "://")
		if scheme == "ipc" {
			return configured
		}
		return "tcp://" + a.String()
	}
	return configured
}

// Subscribed reports whether a subscriber's subscription has reached the PUB socket
// (a message published before that is lost to it, as with any ZMQ PUB).
func (p *Publisher) Subscribed() bool {
	t, ok := p.pub.(zmq4.Topics)
	return ok && len(t.Topics()) > 0
}

// Publish encodes and sends one batch with the next sequence number, and buffers it
// for replay.
func (p *Publisher) Publish(b *Batch) error {
	payload, err := Encode(b, p.cfg.Form)
	if err != nil {
		return err
	}
	return p.PublishPayload(payload, true)
}

// PublishPayload sends a payload as it is (send false only buffers it, as if the
// message were lost on the way: a gap that replay can fill), with the next sequence
// number. Tests use it for garbage and gaps.
func (p *Publisher) PublishPayload(payload []byte, send bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := p.seq
	p.seq++
	entry := buffered{seq: seq, payload: payload}
	if len(p.buffer) < p.cfg.Buffer {
		p.buffer = append(p.buffer, entry)
	} else {
		p.buffer[p.next] = entry
		p.next = (p.next + 1) % p.cfg.Buffer
	}
	if !send {
		return nil
	}
	return p.pub.Send(zmq4.NewMsgFrom(MessageFrames(p.cfg.Topic, seq, payload)...))
}

// serveReplay answers replay requests until Close: every buffered batch from the
// requested sequence number on, then the end marker.
func (p *Publisher) serveReplay() {
	for {
		msg, err := p.router.Recv()
		if err != nil {
			if errors.Is(err, context.Canceled) {
				return
			}
			continue
		}
		id, start, err := ParseReplayRequest(msg.Frames)
		if err != nil {
			continue
		}
		p.mu.Lock()
		var out []buffered
		for i := range p.buffer {
			e := p.buffer[(p.next+i)%len(p.buffer)]
			if e.seq >= start {
				out = append(out, e)
			}
		}
		p.mu.Unlock()
		for _, e := range out {
			frames := append([][]byte{id}, ReplayFrames(p.cfg.ReplayLayout, p.cfg.Topic, e.seq, e.payload)...)
			if p.router.Send(zmq4.NewMsgFrom(frames...)) != nil {
				break
			}
		}
		_ = p.router.Send(zmq4.NewMsgFrom(append([][]byte{id}, ReplayEnd(p.cfg.ReplayLayout, p.cfg.Topic)...)...))
	}
}

// Close stops the publisher.
func (p *Publisher) Close() {
	p.cancel()
	if p.pub != nil {
		_ = p.pub.Close()
	}
	if p.router != nil {
		_ = p.router.Close()
	}
	p.done.Wait()
}
