package envoytest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// errTimeout is a message timer expiry (ext_proc.cc, Filter::onMessageTimeout).
var errTimeout = errors.New("ext_proc message timeout")

// errClosed is the processor ending its stream cleanly before a reply: Envoy continues
// the request unmodified (ext_proc.cc, Filter::onGrpcClose).
var errClosed = errors.New("ext_proc stream closed by the processor")

// processor is one ext_proc stream from the data plane's side. A pump goroutine reads
// replies so FULL_DUPLEX can send and receive at once.
type processor struct {
	stream  extprocv3.ExternalProcessor_ProcessClient
	replies chan reply
	ex      *Exchange
	mu      *sync.Mutex // guards ex
	first   bool        // the next message is the stream's first
	pc      *extprocv3.ProtocolConfiguration
	onSent  func(path string, msg *extprocv3.ProcessingRequest)
	// maxMessageTimeout is Config.MaxMessageTimeout: the longest override_message_timeout
	// honoured; 0 honours none.
	maxMessageTimeout time.Duration
}

type reply struct {
	msg *extprocv3.ProcessingResponse
	err error
	// sent is how many messages had been sent to the processor when it arrived: an
	// override_message_timeout that arrived before the message recv waits for was sent
	// had no timer to restart.
	sent int
}

func (p *processor) start() {
	p.replies = make(chan reply, 64)
	go func() {
		defer close(p.replies)
		for {
			msg, err := p.stream.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = errClosed
				}
				p.replies <- reply{err: err}
				return
			}
			p.mu.Lock()
			p.ex.Received = append(p.ex.Received, msg)
			sent := len(p.ex.Sent)
			p.mu.Unlock()
			p.replies <- reply{msg: msg, sent: sent}
		}
	}()
}

func (p *processor) send(req *extprocv3.ProcessingRequest) error {
	if p.first {
		req.ProtocolConfig = p.pc
		p.first = false
	}
	p.mu.Lock()
	p.ex.Sent = append(p.ex.Sent, req)
	p.mu.Unlock()
	if err := p.stream.Send(req); err != nil {
		return fmt.Errorf("ext_proc send: %w", err)
	}
	if p.onSent != nil {
		p.onSent(p.ex.Path, req)
	}
	return nil
}

// recv waits for the next reply; timeout 0 waits without a timer (FULL_DUPLEX). A
// reply carrying override_message_timeout is not a reply: it restarts the timer once
// (see Config.MaxMessageTimeout), or is ignored, and recv waits on. One that arrived
// before the awaited message was sent is ignored: no timer ran then.
func (p *processor) recv(ctx context.Context, timeout time.Duration) (*extprocv3.ProcessingResponse, error) {
	p.mu.Lock()
	sends := len(p.ex.Sent)
	p.mu.Unlock()
	var timer <-chan time.Time
	var t *time.Timer
	if timeout > 0 {
		t = time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	restarted := false
	for {
		select {
		case r, ok := <-p.replies:
			if !ok {
				return nil, errClosed
			}
			if r.err != nil || r.msg.GetOverrideMessageTimeout() == nil {
				return r.msg, r.err
			}
			d := r.msg.GetOverrideMessageTimeout().AsDuration()
			honoured := t != nil && !restarted && r.sent >= sends && p.maxMessageTimeout >= time.Millisecond &&
				d >= time.Millisecond && d <= p.maxMessageTimeout
			p.mu.Lock()
			if honoured {
				p.ex.MessageTimerRestarts = append(p.ex.MessageTimerRestarts, d)
			} else {
				p.ex.IgnoredTimerOverrides++
			}
			p.mu.Unlock()
			if honoured {
				t.Reset(d)
				restarted = true
			}
		case <-timer:
			return nil, errTimeout
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
