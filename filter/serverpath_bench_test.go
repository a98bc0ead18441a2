package filter_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/server"
	"github.com/kvroute/kvroute/tokenize"
)

// The server-path benchmarks measure what one request costs kvroute through its ext_proc
// handler, as cmd/extproc wires it (approximate tokenizer, ChatML, the kv picker with
// the default cost, an index of 4 workers × 16,384 blocks of 64 tokens, metrics on):
// request headers, a BUFFERED body, response headers and a STREAMED response of 64
// one-token SSE chunks then the usage chunk and [DONE] (66 body messages, as a vLLM
// stream reaches Envoy). Bodies are turns of 32 chat sessions whose prompts grow from
// about 2,000 to 4,000 tokens (cmd/loadtest's workload), visited turn by turn so resumed
// turns find their prefix in the index. One op is one whole request.
//
//   - Handler: filter.Server.Process over an in-memory stream of prebuilt messages:
//     kvroute's own work and allocations, without gRPC.
//   - GRPC: the same over a loopback gRPC connection with the server's options and
//     interceptors: adds protobuf and HTTP/2 on both sides (the client's share is in
//     the figure too).
//   - MessagesHandler: Handler for the same sessions as Anthropic Messages API bodies
//     (POST /v1/messages: the system prompt top-level, the turns as string messages,
//     a stream of 64 content_block_delta events as vLLM writes it): what the rebuild of
//     the chat vLLM converts them to adds.
//
// Both run under b.RunParallel with 8 goroutines per CPU, so decisions contend for the
// router's lock and the index as concurrent streams do. Besides wall time they report
// cpu-ns/op, the process's CPU time (user + system, GC included) per request, which
// other work on a shared machine does not inflate the way it does wall time.
func BenchmarkServerPath(b *testing.B) {
	b.Run("Handler", func(b *testing.B) {
		srv, requests, _ := benchServer(b, false)
		eachRequest(b, requests, func(msgs []*extprocv3.ProcessingRequest) error {
			st := &memStream{ctx: context.Background(), msgs: msgs}
			if err := srv.Process(st); err != nil {
				return err
			}
			return st.check()
		})
	})
	b.Run("MessagesHandler", func(b *testing.B) {
		srv, requests, registry := benchServer(b, true)
		eachRequest(b, requests, func(msgs []*extprocv3.ProcessingRequest) error {
			st := &memStream{ctx: context.Background(), msgs: msgs}
			if err := srv.Process(st); err != nil {
				return err
			}
			return st.check()
		})
		// Every request must have been routed on its rendered prompt: a fallback to load
		// would measure nothing of the rebuild.
		families, err := registry.Gather()
		if err != nil {
			b.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() == "kvroute_router_prompt_fallbacks_total" {
				for _, m := range f.GetMetric() {
					if m.GetCounter().GetValue() > 0 {
						b.Fatalf("requests routed by load: %v", m)
					}
				}
			}
		}
	})
	b.Run("GRPC", func(b *testing.B) {
		srv, requests, _ := benchServer(b, false)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		gs := grpc.NewServer(append(server.Options(filter.DefaultConfig().MaxBodyBytes), server.Recovery(slog.New(slog.DiscardHandler), nil)...)...)
		extprocv3.RegisterExternalProcessorServer(gs, srv)
		go func() { _ = gs.Serve(ln) }()
		defer gs.Stop()
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		client := extprocv3.NewExternalProcessorClient(conn)
		eachRequest(b, requests, func(msgs []*extprocv3.ProcessingRequest) error { return roundTrips(client, msgs) })
	})
}

// eachRequest plays the requests in turn from 8 goroutines per CPU, one op each, and
// reports allocations and cpu-ns/op.
func eachRequest(b *testing.B, requests [][]*extprocv3.ProcessingRequest, play func([]*extprocv3.ProcessingRequest) error) {
	var next atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(8)
	defer reportCPU(b)()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := play(requests[int(next.Add(1)-1)%len(requests)]); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// reportCPU starts counting the process's CPU time; the returned func reports it per op.
func reportCPU(b *testing.B) func() {
	start := processCPU()
	return func() { b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op") }
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchServer builds the filter as cmd/extproc does, and the workload's requests as
// Envoy's messages: chat completions, or with messages Anthropic Messages API bodies.
// The handler does not modify what it receives, so the messages are built once and
// replayed. The registry holds the router's and the filter's metrics.
func benchServer(b *testing.B, messages bool) (*filter.Server, [][]*extprocv3.ProcessingRequest, *prometheus.Registry) {
	b.Helper()
	const workers = 4
	idx, err := index.New(index.Config{CapacityBlocks: 16384, TTL: index.DefaultConfig().TTL}, nil)
	if err != nil {
		b.Fatal(err)
	}
	var fleet []router.Worker
	for i := range workers {
		name := fmt.Sprint("w", i)
		fleet = append(fleet, router.Worker{Name: name, Address: fmt.Sprintf("127.0.0.1:%d", 8000+i)})
		if err := idx.SetWorker(name, 0); err != nil {
			b.Fatal(err)
		}
	}
	policy, err := scoring.NewPolicy(scoring.DefaultParams())
	if err != nil {
		b.Fatal(err)
	}
	registry := prometheus.NewRegistry()
	picker := scoring.Pickers()["kv"].New(policy, rand.New(rand.NewPCG(1, 2)))
	r, err := router.New(router.Config{BlockSize: router.DefaultBlockSize, Workers: fleet}, router.Deps{
		Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}, Index: idx,
		Bookings: scoring.NewBookings(), Picker: picker, RecordBlocks: true, Metrics: router.NewMetrics(registry),
	})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := filter.New(filter.DefaultConfig(), filter.Deps{Router: r, Policy: policy, Metrics: filter.NewMetrics(registry)})
	if err != nil {
		b.Fatal(err)
	}
	path, reply, bodies := "/v1/chat/completions", sseReply(64), sessionBodies(32, false)
	if messages {
		path, reply, bodies = "/v1/messages", anthropicSSEReply(64), sessionBodies(32, true)
	}
	var requests [][]*extprocv3.ProcessingRequest
	for _, body := range bodies {
		if messages {
			// A body routed by load would measure nothing of the rebuild.
			parsed, err := openai.ParseMessages(body, openai.DefaultLimits())
			if err == nil {
				_, err = filter.MessagesRouteRequest(parsed, body, openai.DefaultLimits())
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		requests = append(requests, requestMessages(path, body, reply))
	}
	return srv, requests, registry
}

// sessionBodies returns the request bodies of n sessions, turn by turn: a 2,000-token
// system prompt, then 128 user and 64 assistant tokens a turn while under 4,000; as
// chat completions, or with anthropic as Anthropic Messages API bodies (the system
// prompt top-level).
func sessionBodies(n int, anthropic bool) [][]byte {
	rng := rand.New(rand.NewPCG(7, 7))
	// Words of three letters, with a line break every 16 (chat text has them, and JSON
	// escapes them).
	words := func(k int) string {
		var sb strings.Builder
		for i := range k {
			sep := byte(' ')
			if i%16 == 15 {
				sep = '\n'
			}
			sb.WriteByte(sep)
			for range 3 {
				sb.WriteByte(byte('a' + rng.IntN(26)))
			}
		}
		return sb.String()
	}
	type session struct {
		system string
		msgs   []string
	}
	sessions := make([]session, n)
	for i := range sessions {
		sessions[i].system = words(2000)
		if !anthropic {
			sessions[i].msgs = []string{fmt.Sprintf(`{"role":"system","content":%q}`, sessions[i].system)}
		}
	}
	var bodies [][]byte
	for tokens := 2000; tokens+128 <= 4000; tokens += 128 + 64 {
		for i := range sessions {
			s := &sessions[i]
			s.msgs = append(s.msgs, fmt.Sprintf(`{"role":"user","content":%q}`, words(128)))
			if anthropic {
				bodies = append(bodies, fmt.Appendf(nil, `{"model":"mock","stream":true,"max_tokens":64,"system":%q,"messages":[%s]}`,
					s.system, strings.Join(s.msgs, ",")))
			} else {
				bodies = append(bodies, []byte(`{"model":"mock","stream":true,"stream_options":{"include_usage":true},"max_tokens":64,"messages":[`+
					strings.Join(s.msgs, ",")+"]}"))
			}
			s.msgs = append(s.msgs, fmt.Sprintf(`{"role":"assistant","content":%q}`, words(64)))
		}
	}
	return bodies
}

// sseReply is a streamed chat answer of n one-token chunks, the usage chunk and [DONE],
// one SSE event per body message as vLLM writes them.
func sseReply(n int) [][]byte {
	var out [][]byte
	for i := range n {
		out = append(out, fmt.Appendf(nil, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"mock\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" w%02d\"},\"finish_reason\":null}]}\n\n", i))
	}
	out = append(out, []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"mock","choices":[],"usage":{"prompt_tokens":3000,"completion_tokens":64,"total_tokens":3064,"prompt_tokens_details":{"cached_tokens":2944}}}`+"\n\n"),
		[]byte("data: [DONE]\n\n"))
	return out
}

// anthropicSSEReply is a streamed Messages API answer of n one-token text deltas, as
// vLLM's /v1/messages writes it: named events, message_start to message_stop.
func anthropicSSEReply(n int) [][]byte {
	out := [][]byte{
		[]byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"chatcmpl-1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"mock\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":3000,\"output_tokens\":0}}}\n\n"),
		[]byte("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"),
	}
	for i := range n {
		out = append(out, fmt.Appendf(nil, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" w%02d\"}}\n\n", i))
	}
	return append(out,
		[]byte("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"),
		[]byte("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"input_tokens\":3000,\"output_tokens\":64}}\n\n"),
		[]byte("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"))
}

// requestMessages is what Envoy sends for one request to path in BUFFERED/STREAMED mode.
func requestMessages(path string, body []byte, reply [][]byte) []*extprocv3.ProcessingRequest {
	hv := func(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }
	msgs := []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			hv(":method", "POST"), hv(":path", path), hv(":authority", "gateway"), hv(":scheme", "http"),
			hv("content-type", "application/json"), hv("content-length", fmt.Sprint(len(body))),
		}}}},
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: extprocfilterv3.ProcessingMode_BUFFERED, ResponseBodyMode: extprocfilterv3.ProcessingMode_STREAMED}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}},
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			hv(":status", "200"), hv("content-type", "text/event-stream"),
		}}}}},
	}
	for i, chunk := range reply {
		msgs = append(msgs, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: chunk, EndOfStream: i == len(reply)-1}}})
	}
	return msgs
}

// roundTrips plays one request over a gRPC stream, as Envoy does: each message waits
// for its reply; the body's reply must name a worker.
func roundTrips(client extprocv3.ExternalProcessorClient, msgs []*extprocv3.ProcessingRequest) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := client.Process(ctx)
	if err != nil {
		return err
	}
	for i, m := range msgs {
		if err := stream.Send(m); err != nil {
			return err
		}
		reply, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
		if i == 1 && len(reply.GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders()) == 0 {
			return fmt.Errorf("the body's reply names no worker: %v", reply)
		}
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("after the last reply: %v, want EOF", err)
	}
	return nil
}

// memStream is an ext_proc stream in memory: it hands the handler msgs in order and
// keeps what it answers.
type memStream struct {
	grpc.ServerStream // nil: the handler uses only Context, Recv and Send
	ctx               context.Context
	msgs              []*extprocv3.ProcessingRequest
	next              int
	replies           int
	routed            bool
}

func (s *memStream) Context() context.Context { return s.ctx }

func (s *memStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if s.next == len(s.msgs) {
		return nil, io.EOF
	}
	s.next++
	return s.msgs[s.next-1], nil
}

func (s *memStream) Send(r *extprocv3.ProcessingResponse) error {
	s.replies++
	if len(r.GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders()) > 0 {
		s.routed = true
	}
	return nil
}

// check reports a request that was not routed or not answered message by message.
func (s *memStream) check() error {
	if !s.routed || s.replies != len(s.msgs) || s.next != len(s.msgs) {
		return fmt.Errorf("routed %v, %d replies to %d of %d messages", s.routed, s.replies, s.next, len(s.msgs))
	}
	return nil
}
