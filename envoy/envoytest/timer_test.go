package envoytest

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// slowBody is a processor that answers the request body late: it first sends one
// reply per entry of overrides carrying override_message_timeout, then waits delay,
// then sends the body reply naming destination. Other messages are answered at once.
type slowBody struct {
	extprocv3.UnimplementedExternalProcessorServer
	overrides   []time.Duration
	delay       time.Duration
	destination string
}

func (s *slowBody) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
			return nil
		}
		if err != nil {
			return err
		}
		reply := continueAll(req)
		if req.GetRequestBody() != nil {
			for _, d := range s.overrides {
				if err := stream.Send(&extprocv3.ProcessingResponse{OverrideMessageTimeout: durationpb.New(d)}); err != nil {
					return err
				}
			}
			time.Sleep(s.delay)
			reply = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
				Response: headersReply(true, set("x-gateway-destination-endpoint", s.destination, true)).GetRequestHeaders().GetResponse()}}}
		}
		if err := stream.Send(reply); err != nil {
			return err
		}
	}
}

// TestOverrideMessageTimeoutRestartsTheTimerOnceWithinMaxMessageTimeout pins Envoy's
// handling of override_message_timeout (ext_proc.cc, Filter::onNewTimeout and
// ProcessorState::restartMessageTimer): a reply carrying it restarts the running
// message timer at its value when max_message_timeout is set and at least as long, once
// per message; otherwise it is ignored, and the first timer runs out (504).
func TestOverrideMessageTimeoutRestartsTheTimerOnceWithinMaxMessageTimeout(t *testing.T) {
	const messageTimeout, delay = 300 * time.Millisecond, 900 * time.Millisecond
	for _, tc := range []struct {
		name         string
		maxTimeout   time.Duration
		overrides    []time.Duration
		wantStatus   int
		wantRestarts []time.Duration
		wantIgnored  int
	}{
		{name: "none sent: the timer runs out", maxTimeout: 10 * time.Second, wantStatus: 504},
		{name: "within max_message_timeout: the body is answered", maxTimeout: 10 * time.Second,
			overrides: []time.Duration{5 * time.Second}, wantStatus: 200, wantRestarts: []time.Duration{5 * time.Second}},
		{name: "max_message_timeout unset: ignored", overrides: []time.Duration{5 * time.Second}, wantStatus: 504, wantIgnored: 1},
		{name: "past max_message_timeout: ignored", maxTimeout: 2 * time.Second,
			overrides: []time.Duration{5 * time.Second}, wantStatus: 504, wantIgnored: 1},
		{name: "a second one for the same message: ignored", maxTimeout: 10 * time.Second,
			overrides: []time.Duration{5 * time.Second, 50 * time.Millisecond}, wantStatus: 200,
			wantRestarts: []time.Duration{5 * time.Second}, wantIgnored: 1},
		{name: "a restart shorter than the time left: it runs out sooner", maxTimeout: 10 * time.Second,
			overrides: []time.Duration{50 * time.Millisecond}, wantStatus: 504, wantRestarts: []time.Duration{50 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			gs := grpc.NewServer()
			extprocv3.RegisterExternalProcessorServer(gs, &slowBody{overrides: tc.overrides, delay: delay, destination: echoUpstream(t)})
			go func() { _ = gs.Serve(ln) }()
			t.Cleanup(gs.Stop)

			s := newPlane(t, Config{ProcessorAddress: ln.Addr().String(), MessageTimeout: messageTimeout, MaxMessageTimeout: tc.maxTimeout,
				ProcessingMode: &extprocfilterv3.ProcessingMode{RequestBodyMode: buffered}})
			code, body := do(t, s, "abc")
			assert.Equal(t, tc.wantStatus, code, body)
			ex := s.Exchanges()
			require.Len(t, ex, 1)
			assert.Equal(t, tc.wantRestarts, ex[0].MessageTimerRestarts)
			assert.Equal(t, tc.wantIgnored, ex[0].IgnoredTimerOverrides)
		})
	}
}

// TestAnOverrideThatCameBeforeItsMessageWasSentIsIgnored: Envoy restarts only a timer
// that runs; an override_message_timeout that reached the data plane between two
// messages (no reply awaited) restarts nothing, and the next message's own timer runs
// out. (Through a live stream, when it arrives relative to the next message is a race;
// the processor's replies are played here.)
func TestAnOverrideThatCameBeforeItsMessageWasSentIsIgnored(t *testing.T) {
	for _, tc := range []struct {
		name        string
		sentBefore  int // messages sent when the override arrived
		wantTimeout bool
	}{
		{"arrived while the message awaited its reply: honoured", 1, false},
		{"arrived before the message was sent: ignored", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			ex := &Exchange{Sent: []*extprocv3.ProcessingRequest{{}}} // one message sent, awaiting its reply
			p := &processor{ex: ex, mu: &mu, maxMessageTimeout: time.Minute, replies: make(chan reply, 2)}
			p.replies <- reply{msg: &extprocv3.ProcessingResponse{OverrideMessageTimeout: durationpb.New(time.Minute)}, sent: tc.sentBefore}
			// The message's reply comes after its 50 ms timer: only a restarted timer waits.
			answer := time.AfterFunc(200*time.Millisecond, func() { p.replies <- reply{msg: &extprocv3.ProcessingResponse{}, sent: 1} })
			defer answer.Stop()
			_, err := p.recv(context.Background(), 50*time.Millisecond)
			if tc.wantTimeout {
				assert.ErrorIs(t, err, errTimeout)
				assert.Equal(t, 1, ex.IgnoredTimerOverrides)
				assert.Empty(t, ex.MessageTimerRestarts)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, []time.Duration{time.Minute}, ex.MessageTimerRestarts)
		})
	}
}
