package envoytest

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

// closesOnResponseBody routes every request to up and ends its stream cleanly at the
// first response body chunk, as a processor that shuts down mid-response does.
type closesOnResponseBody struct {
	extprocv3.UnimplementedExternalProcessorServer
	up     string
	closed chan struct{}
}

func (p closesOnResponseBody) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return err
		}
		switch req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			err = stream.Send(headersReply(false, set("x-gateway-destination-endpoint", p.up, true)))
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			err = stream.Send(continueAll(req))
		case *extprocv3.ProcessingRequest_ResponseBody:
			close(p.closed)
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// TestProcessorClosingMidFullDuplexResponse: the processor ends its stream cleanly while
// the upstream is still sending a FULL_DUPLEX_STREAMED response. The goroutine that
// passes the rest of the body on must not touch the flow's processor, which the clean
// close drops: that was a data race, and a nil dereference once the rest arrived.
func TestProcessorClosingMidFullDuplexResponse(t *testing.T) {
	release := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "first piece")
		w.(http.Flusher).Flush()
		<-release
		_, _ = io.WriteString(w, strings.Repeat("rest ", 1000))
	}))
	defer upstream.Close()
	defer close(release)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	proc := closesOnResponseBody{up: strings.TrimPrefix(upstream.URL, "http://"), closed: make(chan struct{})}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, proc)
	go func() { _ = gs.Serve(ln) }()
	defer gs.Stop()

	mode := &extprocfilterv3.ProcessingMode{ResponseBodyMode: fullDuplex, ResponseTrailerMode: extprocfilterv3.ProcessingMode_SEND}
	s := newPlane(t, Config{ProcessorAddress: ln.Addr().String(), ProcessingMode: mode, MessageTimeout: time.Minute})
	go func() {
		<-proc.closed
		// Let the data plane see the close before the upstream sends the rest.
		time.Sleep(50 * time.Millisecond)
		release <- struct{}{}
	}()
	resp, err := s.Client().Get(s.URL + "/v1/test")
	if err != nil {
		return // reset before the headers went out
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	assert.NotContains(t, string(body), "rest", "the processor never passed the rest on")
}
