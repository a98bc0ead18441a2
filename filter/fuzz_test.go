package filter

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
)

// FuzzStream plays one well-formed ext_proc exchange with hostile content: any path,
// method, model header, request body (in up to three chunks), upstream status and
// response body, in every pair of body modes. kvroute must answer every message without
// a protocol error or a panic, name only configured workers, and free the booking.
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
	} {
		f.Add(seed.modes, seed.path, seed.method, seed.model, seed.body, seed.split, seed.status, seed.response)
	}
	workers := []router.Worker{{Name: "w0", Address: "10.0.0.1:8000", Models: []string{"m"}}, {Name: "w1", Address: "10.0.0.2:8000"}}
	idx, err := index.New(index.Config{CapacityBlocks: 64}, nil)
	if err != nil {
		f.Fatal(err)
	}
	bookings := scoring.NewBookings()
	picker, err := scoring.NewKVCost(scoring.DefaultParams(), rand.New(rand.NewPCG(1, 2)))
	if err != nil {
		f.Fatal(err)
	}
	r, err := router.New(router.Config{BlockSize: 4, Workers: workers}, router.Deps{
		Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}, Index: idx, Bookings: bookings, Picker: picker, RecordBlocks: true,
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
	srv, err := New(cfg, Deps{Router: r})
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
		handle := func(req *extprocv3.ProcessingRequest) {
			t.Helper()
			replies, err := st.handle(ctx, req)
			if err != nil {
				t.Fatalf("%T: %v", req.GetRequest(), err)
			}
			for _, reply := range replies {
				if reply.GetResponse() == nil {
					t.Fatalf("an empty reply to %T", req.GetRequest())
				}
				if ir := reply.GetImmediateResponse(); ir != nil {
					// A rejection is a clear OpenAI error, never an empty local reply.
					var e struct {
						Error struct{ Message, Code string }
					}
					if err := json.Unmarshal(ir.GetBody(), &e); err != nil || e.Error.Message == "" || e.Error.Code == "" || ir.GetStatus().GetCode() < 400 {
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
		if st.phase != phaseDone && st.decision != nil {
			handle(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
				Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(status)}}}}}})
			if st.phase != phaseDone && respMode != extprocfilterv3.ProcessingMode_NONE {
				handle(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
					ResponseBody: &extprocv3.HttpBody{Body: response, EndOfStream: true}}})
			}
		}
		st.release(outcomeCancelled) // Process's deferred release
		for _, w := range workers {
			if bookings.Load(w.Name) != (scoring.Load{}) {
				t.Fatalf("%s still booked: %+v", w.Name, bookings.Load(w.Name))
			}
		}
	})
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
