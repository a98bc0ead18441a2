package filter_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/filter"
)

// With fallback endpoints the data plane may serve a request from a fallback, and says
// which endpoint served it in envoy.lb / x-gateway-destination-endpoint-served on the
// response (docs/proposals/004-endpoint-picker-protocol, Destination Endpoint Served).
// The response's status is then that endpoint's, not the chosen worker's: kvroute
// passed it to the chosen worker's health, so a fallback's 200 cleared the failures of
// a primary that could not be reached, and a fallback's 503 counted against it.
func TestTheServedEndpointDecidesWhoseStatusTheResponseIs(t *testing.T) {
	for _, served := range []string{"fallback", "primary", "unreported"} {
		t.Run(served, func(t *testing.T) {
			health := &statuses{}
			p := newPlane(t, planeOptions{workers: 2, health: health, filterCfg: func(c *filter.Config) { c.FallbackEndpoints = 1 }})
			exchange, listed := routedStream(t, p, "served")
			list := strings.Join(listed, ",")
			require.Len(t, p.workers, 2)
			primary, fallback := p.workers[0], p.workers[1]
			if list != primary.address()+","+fallback.address() {
				primary, fallback = fallback, primary
			}
			require.Equal(t, primary.address()+","+fallback.address(), list)

			resp := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
				Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("503")}}}, EndOfStream: true}}}
			addr := map[string]string{"fallback": fallback.address(), "primary": primary.address()}[served]
			if addr != "" {
				md, err := structpb.NewStruct(map[string]any{"x-gateway-destination-endpoint-served": addr})
				require.NoError(t, err)
				resp.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.lb": md}}
			}
			exchange(resp)
			p.requireIdle(t)
			if served == "fallback" {
				assert.Empty(t, health.of(primary.name), "the fallback's 503 is not the primary's")
				assert.Equal(t, []int{503}, health.of(fallback.name), "it is the fallback's")
				return
			}
			assert.Equal(t, []int{503}, health.of(primary.name))
		})
	}
}

// A GIE data plane serves a request from a fallback when the chosen worker cannot take
// it (here: its process is gone), and says which endpoint served. What the decision put
// on the chosen worker follows the request: the booking (so load is counted where it
// runs), the recorded blocks (so the fallback is known to hold the conversation and the
// chosen worker is not credited with blocks it never computed), the session and the
// response's health. Before, all but health stayed on the chosen worker, and the
// session's next turn was sent to the dead worker first again.
func TestARequestAFallbackServedTakesItsBookingBlocksAndSessionThere(t *testing.T) {
	health := &statuses{}
	p := newPlane(t, planeOptions{workers: 2, health: health, sessions: true,
		filterCfg: func(c *filter.Config) { c.FallbackEndpoints = 1 },
		envoyCfg:  func(c *envoytest.Config) { c.ServeFromFallbacks = true }})
	session := []string{"x-session-id", "conversation-1"}
	turn := func(n int) string {
		text := "a conversation that grows by one long turn at a time"
		for i := 1; i < n; i++ {
			text += fmt.Sprintf(" and then turn %d adds several more words to the prompt", i)
		}
		return chat(text, false)
	}
	first := func(list string) string { return strings.Split(list, ",")[0] }
	listed := func() string {
		ex := p.envoy.Exchanges()
		return ex[len(ex)-1].DynamicMetadata["envoy.lb"].GetFields()["x-gateway-destination-endpoint"].GetStringValue()
	}

	resp, _ := p.post(t, "/v1/chat/completions", turn(1), session...)
	require.Equal(t, 200, resp.StatusCode)
	byAddr := map[string]*worker{p.workers[0].address(): p.workers[0], p.workers[1].address(): p.workers[1]}
	chosen := byAddr[first(listed())]
	var fallback *worker
	for _, w := range p.workers {
		if w != chosen {
			fallback = w
		}
	}
	heldByChosen := p.index.WorkerEntries(chosen.name)
	require.Positive(t, heldByChosen)
	require.Zero(t, p.index.WorkerEntries(fallback.name))

	chosen.Close() // its engine is gone; kvroute has not noticed
	resp, _ = p.post(t, "/v1/chat/completions", turn(2), session...)
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, chosen.address(), first(listed()), "the holder was chosen again")
	require.Len(t, fallback.Served(), 1, "the data plane served the second turn from the fallback")
	p.requireIdle(t)
	assert.Equal(t, 1.0, p.counter(t, "kvroute_filter_served_elsewhere_total", map[string]string{"result": "moved"}))
	assert.Equal(t, 1.0, p.counter(t, "kvroute_filter_completions_total", map[string]string{"worker": fallback.name, "outcome": "success"}),
		"the completion counts where the request ran")
	assert.Equal(t, []int{200}, health.of(fallback.name), "the response's status is the fallback's")
	assert.Equal(t, []int{200}, health.of(chosen.name), "only the first turn's status is the chosen worker's")
	assert.Equal(t, heldByChosen, p.index.WorkerEntries(chosen.name), "the chosen worker keeps what it computed, and is not credited with the second turn")
	assert.Greater(t, p.index.WorkerEntries(fallback.name), heldByChosen, "the fallback holds the whole second turn")

	resp, _ = p.post(t, "/v1/chat/completions", turn(3), session...)
	require.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, fallback.address(), first(listed()), "the session's next turn goes where its blocks are")
	p.requireIdle(t)
}

// An endpoint the decision did not list (a data plane that picked on its own) moves
// nothing: kvroute cannot tell which worker that is.
func TestAResponseServedByAnUnlistedEndpointMovesNothing(t *testing.T) {
	p := newPlane(t, planeOptions{workers: 2, filterCfg: func(c *filter.Config) { c.FallbackEndpoints = 1 }})
	exchange, list := routedStream(t, p, "unlisted")
	chosen := list[0]
	booked := func() map[string]int {
		out := map[string]int{}
		for _, w := range p.workers {
			out[w.address()] = p.bookings.Load(w.name).ActiveRequests
		}
		return out
	}
	before := booked()
	require.Equal(t, 1, before[chosen])

	exchange(servedResponseHeaders(t, "10.9.9.9:8000"))
	assert.Equal(t, before, booked(), "the booking stays on the chosen worker")
	assert.Equal(t, 1.0, p.counter(t, "kvroute_filter_served_elsewhere_total", map[string]string{"result": "unlisted"}))
	exchange(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{EndOfStream: true}}})
	p.requireIdle(t)
}

// A worker among the decision's candidates that the destination list left out (past
// fallback_endpoints) is still a worker kvroute knows: when the data plane reports it
// served, the request moves there, as to a listed fallback.
func TestAResponseServedByACandidateLeftOffTheListMovesThere(t *testing.T) {
	p := newPlane(t, planeOptions{workers: 3, filterCfg: func(c *filter.Config) { c.FallbackEndpoints = 1 }})
	exchange, list := routedStream(t, p, "left off the list")
	require.Len(t, list, 2)
	var left *worker
	for _, w := range p.workers {
		if !slices.Contains(list, w.address()) {
			left = w
		}
	}
	require.NotNil(t, left)

	exchange(servedResponseHeaders(t, left.address()))
	for _, w := range p.workers {
		want := 0
		if w == left {
			want = 1
		}
		assert.Equal(t, want, p.bookings.Load(w.name).ActiveRequests, w.name)
	}
	assert.Equal(t, 1.0, p.counter(t, "kvroute_filter_served_elsewhere_total", map[string]string{"result": "moved"}))
	exchange(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{EndOfStream: true}}})
	p.requireIdle(t)
}

// routedStream opens an ext_proc stream as Envoy does for a buffered chat request with
// content and returns it with the destination list kvroute answered (chosen first).
func routedStream(t *testing.T, p *plane, content string) (func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse, []string) {
	t.Helper()
	exchange := p.rawStream(t)
	headers := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
	}}
	exchange(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: buffered, ResponseBodyMode: streamed},
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headers}}})
	reply := exchange(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(chat(content, false)), EndOfStream: true}}})
	list := reply.GetDynamicMetadata().GetFields()["envoy.lb"].GetStructValue().GetFields()["x-gateway-destination-endpoint"].GetStringValue()
	return exchange, strings.Split(list, ",")
}

// servedResponseHeaders is a 200's response headers message whose envoy.lb metadata
// says served named the endpoint that served, as a GIE data plane reports it.
func servedResponseHeaders(t *testing.T, served string) *extprocv3.ProcessingRequest {
	t.Helper()
	md, err := structpb.NewStruct(map[string]any{"x-gateway-destination-endpoint-served": served})
	require.NoError(t, err)
	return &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}}}},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.lb": md}}}
}
