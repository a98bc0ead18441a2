package filter

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/rewrite"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/session"
	"github.com/kvroute/kvroute/tokenize"
)

// FuzzStream plays one well-formed ext_proc exchange with hostile content: any path,
// method, model header, request body (in up to three chunks), upstream status and
// response body, in every pair of body modes. kvroute must answer every message without
// a protocol error or a panic, name only configured workers, and free the booking.
// modeBits' high bits vary the rest: the model-name rewrite header (the model header's
// value), the response's content type (JSON or an event stream), response headers
// skipped (response_header_mode SKIP) and response trailers; the response body comes in
// two chunks where the mode allows. A rewritten request's response must come out as
// the renamer makes it of the whole body, every byte once and in order.
func FuzzStream(f *testing.F) {
	chat := []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}`)
	sse := []byte("data: {\"choices\":[]}\n\ndata: {\"usage\":{\"prompt_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\ndata: [DONE]\n\n")
	for _, seed := range []struct {
		modes               uint8
		path, method, model string
		body                []byte
		split               uint16
		status              string
		response            []byte
	}{
		{0, "/v1/chat/completions", "POST", "", chat, 10, "200", sse},
		{5, "/v1/chat/completions", "POST", "m", chat, 0, "200", sse},
		{10, "/v1/completions?x=1", "POST", "", []byte(`{"model":"m","prompt":[1,2,3]}`), 3, "503", []byte(`{"error":{}}`)},
		{15, "/v1/models", "GET", "other", nil, 0, "200", []byte(`{"data":[]}`)},
		{0, "/v1/chat/completions", "POST", "", []byte(`{"model":`), 1, "", nil},
		{4, "/v1/completions", "POST", "", []byte(`{"model":"m","prompt":"` + string(make([]byte, 300)) + `"}`), 100, "abc", []byte(`"usage":{"prompt_tokens":-1}`)},
		{1, "*", "CONNECT", "\x00", []byte{0xff, 0xfe}, 65535, "99999999999999999999", []byte("\"usage\":")},
		// Rewritten by the header to "t": the response headers skipped (SKIP); an event
		// stream cut inside its model; one that trailers end inside it (FULL_DUPLEX).
		{0x54, "/v1/completions", "POST", "t", []byte(`{"model":"x","prompt":"hi"}`), 0, "200", []byte(`{"model":"t"}`)},
		{0x34, "/v1/completions", "POST", "t", []byte(`{"model":"x","prompt":"hi"}`), 17, "200", []byte("data: {\"model\":\"t\"}\n\ndata: [DONE]\n\n")},
		{0xba, "/v1/completions", "POST", "t", []byte(`{"model":"x","prompt":"hi"}`), 9, "200", []byte(`data: {"model":"t`)},
		// The Responses API: a stored response read from a JSON body or a stream, then
		// named by a follow-up's body and by a path.
		{0, "/v1/responses", "POST", "", []byte(`{"model":"m","input":"hi"}`), 7, "200", []byte(`{"id":"resp_1","output":[{"id":"msg_1"}]}`)},
		{0x14, "/v1/responses", "POST", "", []byte(`{"model":"m","input":"hi","stream":true}`), 30, "200",
			[]byte("event: response.created\ndata: {\"response\":{\"id\":\"resp_2\"},\"type\":\"response.created\"}\n\n")},
		{0, "/v1/responses", "POST", "", []byte(`{"model":"m","input":"more","previous_response_id":"resp_1"}`), 0, "200", []byte(`{"id":"resp_3"}`)},
		{0, "/v1/responses/resp_2/cancel", "POST", "", nil, 0, "400", []byte(`{"error":{}}`)},
		// Anthropic's Messages API: a body rebuilt into its chat (an inline system
		// message, a tool run), a malformed one (Anthropic's error shape), count_tokens
		// by load, a stream of named events whose last usage counts cache reads apart.
		{0, "/v1/messages", "POST", "", []byte(`{"model":"m","max_tokens":8,"system":"be brief","messages":[{"role":"user","content":"hi"},` +
			`{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{"a":1}}]},{"role":"system","content":"note"},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}]}`), 40, "200",
			[]byte("event: message_delta\ndata: {\"usage\":{\"input_tokens\":6,\"cache_read_input_tokens\":4}}\n\n")},
		{0x14, "/v1/messages", "POST", "", []byte(`{"model":7}`), 0, "", nil},
		{0, "/v1/messages/count_tokens", "POST", "m", []byte(`{"model":"m","messages":[]}`), 0, "200", []byte(`{"input_tokens":3}`)},
		// vLLM's token-in/token-out API: a body naming its model, one naming none (the
		// model header's, or any worker by load), one the engine refuses.
		{0, "/inference/v1/generate", "POST", "", []byte(`{"model":"m","token_ids":[1,2,3,4],"sampling_params":{"max_tokens":4}}`), 9, "200",
			[]byte(`{"choices":[{"index":0,"token_ids":[5]}],"usage":{"prompt_tokens":4,"prompt_tokens_details":{"cached_tokens":0}}}`)},
		{0x14, "/inference/v1/generate", "POST", "m", []byte(`{"token_ids":[1,2],"sampling_params":{},"stream":true}`), 0, "200",
			[]byte("data: {\"choices\":[{\"index\":0,\"token_ids\":[5]}]}\n\ndata: [DONE]\n\n")},
		{0, "/inference/v1/generate", "POST", "", []byte(`{"token_ids":[],"sampling_params":{}}`), 0, "", nil},
		// SGLang's native /generate: ids with the model header's model, text without
		// one (by load), a body left to the engine; the answers' meta_info.
		{0, "/generate", "POST", "m", []byte(`{"input_ids":[1,2,3,4],"sampling_params":{"max_new_tokens":4}}`), 5, "200",
			[]byte(`{"text":"x","output_ids":[5],"meta_info":{"prompt_tokens":4,"cached_tokens":0}}`)},
		{0x14, "/generate", "POST", "", []byte(`{"text":"hello","stream":true}`), 0, "200",
			[]byte("data: {\"text\":\"h\",\"meta_info\":{\"prompt_tokens\":2,\"cached_tokens\":1}}\n\ndata: [DONE]\n\n")},
		{0, "/generate", "POST", "m", []byte(`{"input_embeds":[[0.1]]}`), 0, "400", []byte(`{"error":{"message":"x"}}`)},
		// SGLang's sessions: an open whose answer names the id, a turn and a
		// close naming it, pinned; a refused open.
		{0, "/open_session", "POST", "", []byte(`{"capacity_of_str_len":10}`), 0, "200", []byte(`"sess-1"`)},
		{0x14, "/generate", "POST", "", []byte(`{"input_ids":[1],"session_params":{"id":"sess-1","rid":"r"},"stream":true}`), 0, "200",
			[]byte("data: {\"text\":\"\",\"meta_info\":{\"finish_reason\":{\"type\":\"abort\"}}}\n\ndata: [DONE]\n\n")},
		{0, "/close_session", "POST", "m", []byte(`{"session_id":"sess-1"}`), 3, "200", nil},
		{0, "/open_session", "GET", "", []byte(`{"capacity_of_str_len":10,"session_id":"x"}`), 0, "400", []byte(`{"error":{"message":"Failed"}}`)},
	} {
		f.Add(seed.modes, seed.path, seed.method, seed.model, seed.body, seed.split, seed.status, seed.response)
	}
	workers := []router.Worker{{Name: "w0", Address: "10.0.0.1:8000", Models: []string{"m"}}, {Name: "w1", Address: "10.0.0.2:8000"}}
	idx, err := index.New(index.Config{CapacityBlocks: 64}, nil)
	if err != nil {
		f.Fatal(err)
	}
	bookings := scoring.NewBookings()
	// Stored responses and SGLang sessions are remembered across the fuzzer's
	// exchanges, and requests naming them (by body or path) pinned.
	responses, err := session.NewResponses(session.ResponsesConfig{TTL: time.Hour, MaxEntries: 64}, nil)
	if err != nil {
		f.Fatal(err)
	}
	picker, err := scoring.NewKVCost(scoring.DefaultParams(), rand.New(rand.NewPCG(1, 2)))
	if err != nil {
		f.Fatal(err)
	}
	r, err := router.New(router.Config{BlockSize: 4, Workers: workers}, router.Deps{
		Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}, Index: idx, Bookings: bookings, Picker: picker, RecordBlocks: true,
		Responses: responses,
	})
	if err != nil {
		f.Fatal(err)
	}
	for _, w := range workers {
		if err := idx.SetWorker(w.Name, 0); err != nil {
			f.Fatal(err)
		}
	}
	cfg := DefaultConfig()
	cfg.MaxBodyBytes = 1 << 16
	// "m" is rewritten to "t" (w1 serves every model) or kept, by turns.
	rewrites := rewrite.NewTable(rewrite.Config{{Name: "split", Rules: []rewrite.Rule{{Models: []string{"m"},
		Targets: []rewrite.Target{{Model: "t"}, {Model: "m"}}}}}}, rand.New(rand.NewPCG(3, 4)), nil)
	srv, err := New(cfg, Deps{Router: r, Rewrites: rewrites})
	if err != nil {
		f.Fatal(err)
	}
	modes := []extprocfilterv3.ProcessingMode_BodySendMode{
		extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED,
		extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_NONE,
	}

	f.Fuzz(func(t *testing.T, modeBits uint8, path, method, model string, body []byte, split uint16, status string, response []byte) {
		ctx := context.Background()
		st := srv.newStream(ctx)
		reqMode, respMode := modes[modeBits%4], modes[(modeBits/4)%4]
		rewriteHeader, events, skipResponseHeaders, trailers := modeBits&16 != 0, modeBits&32 != 0, modeBits&64 != 0, modeBits&128 != 0
		var sent, forwarded []byte // the response body as sent to kvroute, and as it let it go on
		handle := func(req *extprocv3.ProcessingRequest) {
			t.Helper()
			replies, err := st.handle(ctx, req)
			forwarded = appendForwarded(forwarded, req, replies, respMode)
			if err != nil {
				t.Fatalf("%T: %v", req.GetRequest(), err)
			}
			for _, reply := range replies {
				if reply.GetResponse() == nil {
					t.Fatalf("an empty reply to %T", req.GetRequest())
				}
				if ir := reply.GetImmediateResponse(); ir != nil {
					// A rejection is a clear error, never an empty local reply: OpenAI's,
					// or Anthropic's on the Messages API's paths.
					var e struct {
						Type  string
						Error struct{ Message, Code, Type string }
					}
					err := json.Unmarshal(ir.GetBody(), &e)
					switch {
					case st.anthropic && (err != nil || e.Type != "error" || e.Error.Type == "" || e.Error.Message == "" || e.Error.Code != "" || ir.GetStatus().GetCode() < 400):
						t.Fatalf("rejection %d %q on %q is not an Anthropic error", ir.GetStatus().GetCode(), ir.GetBody(), path)
					case !st.anthropic && (err != nil || e.Error.Message == "" || e.Error.Code == "" || ir.GetStatus().GetCode() < 400):
						t.Fatalf("rejection %d %q is not an OpenAI error", ir.GetStatus().GetCode(), ir.GetBody())
					}
				}
				for _, h := range headerMutation(reply).GetSetHeaders() {
					if h.GetHeader().GetKey() == cfg.DestinationHeader && string(h.GetHeader().GetRawValue()) != workers[0].Address &&
						string(h.GetHeader().GetRawValue()) != workers[1].Address {
						t.Fatalf("destination %q is no configured worker", h.GetHeader().GetRawValue())
					}
				}
			}
		}
		headers := []*corev3.HeaderValue{{Key: ":path", RawValue: []byte(path)}, {Key: ":method", RawValue: []byte(method)},
			{Key: "x-gateway-model-name", RawValue: []byte(model)}}
		if rewriteHeader {
			headers = append(headers, &corev3.HeaderValue{Key: rewrite.Header, RawValue: []byte(model)})
		}
		handle(&extprocv3.ProcessingRequest{
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: reqMode, ResponseBodyMode: respMode},
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: &corev3.HeaderMap{Headers: headers}, EndOfStream: len(body) == 0}},
		})
		chunks := [][]byte{body}
		if reqMode != extprocfilterv3.ProcessingMode_BUFFERED && reqMode != extprocfilterv3.ProcessingMode_NONE {
			at := int(split) % (len(body) + 1)
			chunks = [][]byte{body[:at], body[at:]}
		}
		for i, c := range chunks {
			if st.phase == phaseDone || len(body) == 0 || reqMode == extprocfilterv3.ProcessingMode_NONE {
				break
			}
			handle(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: c, EndOfStream: i == len(chunks)-1}}})
		}
		var rename *rename
		if st.phase != phaseDone && st.decision != nil {
			rename = st.rename
			contentType := "application/json"
			if events {
				contentType = "text/event-stream"
			}
			if !skipResponseHeaders {
				handle(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
					Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(status)},
						{Key: "content-type", RawValue: []byte(contentType)}}}}}})
			}
			chunks := [][]byte{response}
			if respMode == extprocfilterv3.ProcessingMode_STREAMED || respMode == extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
				at := int(split) % (len(response) + 1)
				chunks = [][]byte{response[:at], response[at:]}
			}
			for i, c := range chunks {
				if st.phase == phaseDone || respMode == extprocfilterv3.ProcessingMode_NONE {
					break
				}
				sent = append(sent, c...)
				handle(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
					ResponseBody: &extprocv3.HttpBody{Body: c, EndOfStream: i == len(chunks)-1 && !trailers}}})
			}
			if st.phase != phaseDone && trailers && respMode != extprocfilterv3.ProcessingMode_NONE {
				handle(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
					ResponseTrailers: &extprocv3.HttpTrailers{}}})
			}
		}
		want := sent
		if rename != nil && !skipResponseHeaders {
			want, _ = openai.NewModelRenamer(rename.target, rename.requested, events).Rename(sent, true)
		}
		// A STREAMED reply to trailers carries no body: a body that trailers end inside
		// the model's value loses the held part (README, "Model rewrites").
		if !(trailers && respMode == extprocfilterv3.ProcessingMode_STREAMED && rename != nil) && !bytes.Equal(want, forwarded) {
			t.Fatalf("response body %q went on as %q, want %q", sent, forwarded, want)
		}
		st.release(outcomeCancelled) // Process's deferred release
		for _, w := range workers {
			if bookings.Load(w.Name) != (scoring.Load{}) {
				t.Fatalf("%s still booked: %+v", w.Name, bookings.Load(w.Name))
			}
		}
	})
}

// appendForwarded adds to out the response body bytes that replies let go on for req:
// a STREAMED or BUFFERED chunk as it came or as its reply replaced it, and in
// FULL_DUPLEX_STREAMED the chunks the replies return.
func appendForwarded(out []byte, req *extprocv3.ProcessingRequest, replies []*extprocv3.ProcessingResponse, respMode extprocfilterv3.ProcessingMode_BodySendMode) []byte {
	for _, reply := range replies {
		body := reply.GetResponseBody()
		if body == nil {
			continue
		}
		m := body.GetResponse().GetBodyMutation()
		switch {
		case respMode == extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
			out = append(out, m.GetStreamedResponse().GetBody()...)
		case m.GetClearBody():
		case m.GetBody() != nil:
			out = append(out, m.GetBody()...)
		default:
			out = append(out, req.GetResponseBody().GetBody()...)
		}
	}
	return out
}

func headerMutation(r *extprocv3.ProcessingResponse) *extprocv3.HeaderMutation {
	switch x := r.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		return x.RequestHeaders.GetResponse().GetHeaderMutation()
	case *extprocv3.ProcessingResponse_RequestBody:
		return x.RequestBody.GetResponse().GetHeaderMutation()
	}
	return nil
}
