package filter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// phase is where a stream is in the request's life.
type phase int

const (
	phaseRequestHeaders  phase = iota // waiting for request_headers
	phaseRequestBody                  // reading the request body
	phaseResponseHeaders              // request forwarded; waiting for response_headers
	phaseResponseBody                 // reading the response body
	phaseDone                         // answered or finished: nothing more to do
)

// Outcomes of a routed request, as counted in kvroute_filter_completions_total.
const (
	outcomeSuccess       = "success"
	outcomeUpstreamError = "upstream_error"
	outcomeCancelled     = "cancelled"
)

const (
	// maxStreamedChunk is the largest body chunk kvroute returns in a streamed_response
	// (ENVOY.md §4).
	maxStreamedChunk = 62_000
	// usageTailBytes bounds the response bytes kept to read the final usage object.
	usageTailBytes = 16 << 10

	lbNamespace       = "envoy.lb"
	subsetNamespace   = "envoy.lb.subset_hint"
	subsetKey         = "x-gateway-destination-endpoint-subset"
	destinationMDKey  = "x-gateway-destination-endpoint"
	headerContentType = "content-type"
)

// stream is the state of one ext_proc stream. It is used by one goroutine.
type stream struct {
	srv      *Server
	phase    phase
	reqMode  BodyMode
	respMode BodyMode

	kind        openai.Endpoint // 0: not a routable path
	body        []byte
	subset      []string
	override    *scoring.Params
	overrideErr error
	decision    *router.Decision

	upstreamStatus int
	sawFirstByte   bool
	usageTail      []byte
}

// handle answers one message from Envoy. A returned error ends the stream with that
// gRPC status (Envoy then applies status_on_error when failing closed).
func (st *stream) handle(ctx context.Context, req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
	if pc := req.GetProtocolConfig(); pc != nil {
		st.reqMode, st.respMode = bodyMode(pc.GetRequestBodyMode()), bodyMode(pc.GetResponseBodyMode())
	}
	switch r := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		if st.phase != phaseRequestHeaders {
			return nil, status.Error(codes.FailedPrecondition, "request_headers received twice")
		}
		return st.onRequestHeaders(ctx, req, r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.onRequestBody(ctx, r.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return st.onRequestTrailers(ctx)
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return st.onResponseHeaders(r.ResponseHeaders), nil
	case *extprocv3.ProcessingRequest_ResponseBody:
		return st.onResponseBody(r.ResponseBody), nil
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		st.release(st.finalOutcome())
		st.phase = phaseDone
		return one(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}), nil
	default:
		return nil, status.Errorf(codes.InvalidArgument, "unsupported ext_proc message %T", r)
	}
}

func (st *stream) onRequestHeaders(ctx context.Context, req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) ([]*extprocv3.ProcessingResponse, error) {
	method, path := headerValue(h.GetHeaders(), ":method"), headerValue(h.GetHeaders(), ":path")
	if u, err := url.ParseRequestURI(path); err == nil {
		path = u.Path
	}
	if method == "POST" {
		st.kind = st.srv.paths[path]
	}
	st.readMetadata(req.GetMetadataContext())

	if st.overrideErr != nil {
		return st.reject(st.overrideErr), nil
	}
	// Requests whose body kvroute does not read go to the least-loaded worker, decided now:
	// other paths, and body modes where the headers reply must precede the body.
	if st.kind == 0 || st.reqMode == ModeNone || st.reqMode == ModeStreamed {
		return st.routeByLoad(ctx), nil
	}
	if h.GetEndOfStream() {
		return st.reject(badRequest("request body is required")), nil
	}
	st.phase = phaseRequestBody
	if st.reqMode == ModeFullDuplex {
		return nil, nil // the headers reply waits until the body has been read
	}
	return one(headersReply(nil)), nil
}

// readMetadata reads the GIE subset hint and kvroute's metadata-namespace override.
func (st *stream) readMetadata(md *corev3.Metadata) {
	fm := md.GetFilterMetadata()
	if hint, ok := fm[subsetNamespace]; ok {
		if v, ok := hint.GetFields()[subsetKey]; ok {
			st.subset = []string{}
			for _, e := range v.GetListValue().GetValues() {
				st.subset = append(st.subset, e.GetStringValue())
			}
		}
	}
	if ns, ok := fm[MetadataNamespace]; ok && st.override == nil && st.overrideErr == nil {
		st.override, st.overrideErr = overrideFromStruct(st.srv.policy.Params(), ns)
	}
}

func (st *stream) onRequestBody(ctx context.Context, b *extprocv3.HttpBody) ([]*extprocv3.ProcessingResponse, error) {
	if st.phase != phaseRequestBody {
		// A body kvroute does not read (routed at the headers): pass it on untouched.
		if st.reqMode == ModeFullDuplex {
			return streamedReplies(b.GetBody(), b.GetEndOfStream(), true), nil
		}
		return one(bodyReply(nil)), nil
	}
	if len(st.body)+len(b.GetBody()) > st.srv.cfg.MaxBodyBytes {
		return st.reject(fmt.Errorf("%w: the limit is %d bytes", ErrBodyTooLarge, st.srv.cfg.MaxBodyBytes)), nil
	}
	st.body = append(st.body, b.GetBody()...)
	if !b.GetEndOfStream() {
		if st.reqMode == ModeBuffered {
			// BUFFERED_PARTIAL sends what fits in Envoy's buffer: the body was larger.
			return st.reject(fmt.Errorf("%w: over the gateway's buffer limit", ErrBodyTooLarge)), nil
		}
		return nil, nil
	}
	return st.routeByBody(ctx, true), nil
}

// onRequestTrailers ends a FULL_DUPLEX body that was not closed by end_of_stream.
func (st *stream) onRequestTrailers(ctx context.Context) ([]*extprocv3.ProcessingResponse, error) {
	trailers := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
	if st.phase != phaseRequestBody {
		return one(trailers), nil
	}
	replies := st.routeByBody(ctx, false)
	if st.phase == phaseDone { // rejected: the immediate response ends the request
		return replies, nil
	}
	return append(replies, trailers), nil
}

// routeByBody parses the whole request body, routes it and answers Envoy. endOfStream
// says whether the body ended the request (no trailers follow).
func (st *stream) routeByBody(ctx context.Context, endOfStream bool) []*extprocv3.ProcessingResponse {
	start := st.srv.now()
	body := st.body
	// The body is not needed once routed: drop it, so a long generation does not keep
	// up to max_body_bytes alive (FULL_DUPLEX's echo below only borrows it until sent).
	st.body = nil
	parsed, err := openai.Parse(st.kind, body, st.srv.cfg.limits())
	if err != nil {
		return st.reject(err)
	}
	parseTime := st.srv.now().Sub(start)
	req := router.Request{Model: parsed.Model, CacheSalt: parsed.CacheSalt, Tokens: parsed.Tokens, Chat: parsed.Chat,
		Prompt: parsed.Prompt, Params: st.override, Subset: st.subset}
	d, err := st.srv.router.Route(ctx, &req)
	if err != nil {
		return st.reject(err)
	}
	st.srv.metrics.decided(d, parseTime)
	if st.srv.log.Enabled(ctx, slog.LevelDebug) {
		st.srv.log.Debug("routed", "worker", d.Worker, "address", d.Address, "prompt_tokens", d.PromptTokens,
			"predicted_cached_tokens", d.PredictedCachedTokens, "blocks_lost", d.BlocksLost, "candidates", explain(d))
	}
	if st.reqMode == ModeBuffered {
		// BUFFERED applies a header mutation carried by the body reply (ENVOY.md §3).
		return one(st.accept(d, "routed", bodyReply))
	}
	return append(one(st.accept(d, "routed", headersReply)), streamedReplies(body, endOfStream, true)...)
}

// routeByLoad routes a request without reading its body and answers its headers; any
// body that follows passes through onRequestBody untouched.
func (st *stream) routeByLoad(ctx context.Context) []*extprocv3.ProcessingResponse {
	d, err := st.srv.router.Route(ctx, &router.Request{AnyModel: true, Tokens: []uint32{}, Subset: st.subset, Params: st.override})
	if err != nil {
		return st.reject(err)
	}
	return one(st.accept(d, "load_only", headersReply))
}

// accept takes a decision: the stream now owns its booking and waits for the response.
// It returns reply (the headers or body reply the mode calls for) carrying the
// destination: the header, overwriting any client-supplied value, and the envoy.lb
// metadata, both naming the chosen worker, then its fallbacks if configured.
func (st *stream) accept(d *router.Decision, outcome string, reply func(*extprocv3.HeaderMutation) *extprocv3.ProcessingResponse) *extprocv3.ProcessingResponse {
	st.decision = d
	st.phase = phaseResponseHeaders
	st.srv.metrics.request(outcome)
	if d.AllOut {
		st.srv.metrics.allOut()
	}
	endpoints := []string{d.Address}
	for i := 0; i < st.srv.cfg.FallbackEndpoints && i < len(d.FallbackAddresses); i++ {
		endpoints = append(endpoints, d.FallbackAddresses[i])
	}
	value := strings.Join(endpoints, ",")
	r := reply(&extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
		Header: &corev3.HeaderValue{Key: st.srv.cfg.DestinationHeader, RawValue: []byte(value)},
	}}})
	r.DynamicMetadata = lbMetadataStruct(value)
	return r
}

func (st *stream) onResponseHeaders(h *extprocv3.HttpHeaders) []*extprocv3.ProcessingResponse {
	st.upstreamStatus, _ = strconv.Atoi(headerValue(h.GetHeaders(), ":status"))
	if st.decision != nil && st.srv.health != nil {
		st.srv.health.Observe(st.decision.Worker, st.upstreamStatus)
	}
	reply := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}},
	}}
	st.phase = phaseResponseBody
	if h.GetEndOfStream() || st.respMode == ModeNone {
		// No body will be seen: the response headers are the last sign of the request.
		st.release(st.finalOutcome())
		st.phase = phaseDone
	}
	return one(reply)
}

func (st *stream) onResponseBody(b *extprocv3.HttpBody) []*extprocv3.ProcessingResponse {
	chunk := b.GetBody()
	if st.decision != nil && len(chunk) > 0 && !st.sawFirstByte {
		st.sawFirstByte = true
		st.decision.FirstToken()
	}
	st.keepTail(chunk)
	var replies []*extprocv3.ProcessingResponse
	if st.respMode == ModeFullDuplex {
		replies = streamedReplies(chunk, b.GetEndOfStream(), false)
	} else {
		replies = one(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
			ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}},
		}})
	}
	if b.GetEndOfStream() {
		st.readUsage()
		st.release(st.finalOutcome())
		st.phase = phaseDone
	}
	return replies
}

// keepTail keeps at least the last usageTailBytes of the response, where the usage
// object is. It trims only when the buffer reaches twice that, so each response byte is
// copied a bounded number of times rather than the whole tail once per chunk.
func (st *stream) keepTail(chunk []byte) {
	st.usageTail = append(st.usageTail, chunk...)
	if over := len(st.usageTail) - usageTailBytes; over > usageTailBytes {
		st.usageTail = append(st.usageTail[:0], st.usageTail[over:]...)
	}
}

// tail returns the last usageTailBytes of the response (all of it if shorter).
func (st *stream) tail() []byte {
	return st.usageTail[max(0, len(st.usageTail)-usageTailBytes):]
}

// readUsage counts the engine's reported usage, unless its values cannot be trusted:
// those are counted as rejected and logged, never added to the totals.
func (st *stream) readUsage() {
	u, found, err := openai.ParseUsage(st.tail())
	switch {
	case err != nil:
		st.srv.metrics.usageRejected()
		worker := ""
		if st.decision != nil {
			worker = st.decision.Worker
		}
		st.srv.log.Warn("usage rejected", "worker", worker, "error", err)
	case found:
		st.srv.metrics.usage(u.PromptTokens, u.CachedTokens)
	}
	st.usageTail = nil
}

func (st *stream) finalOutcome() string {
	if st.upstreamStatus >= 200 && st.upstreamStatus < 300 {
		return outcomeSuccess
	}
	return outcomeUpstreamError
}

// release frees the request's booking. Only the first call for a decision counts;
// Process defers one call, so every way out of a stream releases.
func (st *stream) release(outcome string) {
	if st.decision != nil && st.decision.Release() {
		st.srv.metrics.released(st.decision.Worker, outcome)
	}
}

// reject answers with an OpenAI error as an immediate response and ends the stream.
func (st *stream) reject(err error) []*extprocv3.ProcessingResponse {
	apiErr := toAPIError(err)
	st.srv.metrics.request(apiErr.code)
	if apiErr.status >= 500 && !errors.Is(err, router.ErrNoWorkers) {
		st.srv.log.Error("request failed", "error", err)
	}
	st.phase = phaseDone
	return one(immediateReply(apiErr))
}

func one(r *extprocv3.ProcessingResponse) []*extprocv3.ProcessingResponse {
	return []*extprocv3.ProcessingResponse{r}
}

func bodyMode(m extprocfilterv3.ProcessingMode_BodySendMode) BodyMode {
	switch m {
	case extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL:
		return ModeBuffered
	case extprocfilterv3.ProcessingMode_STREAMED:
		return ModeStreamed
	case extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		return ModeFullDuplex
	default:
		return ModeNone
	}
}

// explain is the decision trace: every candidate's cost terms, in blocks, so operators
// can see why a worker won and tune the weights. Logged at debug level only.
func explain(d *router.Decision) []map[string]any {
	out := make([]map[string]any, len(d.Terms))
	for i, t := range d.Terms {
		out[i] = map[string]any{
			"worker": t.Worker, "overlap": t.Overlap, "prefill_tokens": t.PrefillTokens,
			"active_blocks": t.ActiveBlocks, "new_blocks": t.NewBlocks, "active_requests": t.ActiveRequests,
			"held_blocks": t.HeldBlocks, "waiting": t.Waiting, "kv_utilization": t.KVUtilization,
			"prefill": t.Prefill, "requests": t.Requests,
			"affinity": t.Affinity, "pressure": t.Pressure, "cost": t.Cost,
		}
		if mode := d.IndexMode(t.Worker); mode != "" {
			out[i]["index_mode"] = mode // events, or approximate
		}
	}
	return out
}
