package filter

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/explain"
	"github.com/kvroute/kvroute/flowcontrol"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/priority"
	"github.com/kvroute/kvroute/rewrite"
	"github.com/kvroute/kvroute/router"
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
	servedMDKey       = "x-gateway-destination-endpoint-served"
	headerContentType = "content-type"
)

// stream is the state of one ext_proc stream. It is used by one goroutine.
type stream struct {
	srv *Server
	// send sends a reply at once, on the stream's goroutine (Process), outside the
	// replies handle returns: the message timer's override (lengthenMessageTimer).
	// nil: none is sent.
	send     func(*extprocv3.ProcessingResponse) error
	phase    phase
	reqMode  BodyMode
	respMode BodyMode
	// reqPartial, respPartial: Envoy announced BUFFERED_PARTIAL (the mode is then
	// ModeBuffered).
	reqPartial, respPartial bool

	kind openai.Endpoint // 0: not a routable path
	// anthropic: the path is a messages_paths entry or under one (count_tokens): its
	// errors are answered in Anthropic's shape.
	anthropic   bool
	model       string // the model header's value, for load-only routing
	body        []byte
	subset      []string
	override    *routeOverride
	overrideErr error
	decision    *router.Decision
	session     string // the session header's value; "": none
	// storedResponse names the stored Responses API response the request needs (its
	// path's id, or its body's previous_response_id); "": none.
	storedResponse string
	// responseID, when set, reads the id of the response the engine stores for a
	// Responses API request, to remember its worker.
	responseID *openai.ResponseIDReader
	// storesResponse: the request is a Responses API POST whose response the engine
	// stores (store not false); its id is read from the response when it succeeds.
	storesResponse bool
	// sglangSession names the SGLang session the request continues or closes (its
	// body's); "": none. opensSGLangSession: the request opens one, whose id
	// sglangSessionID reads from a successful answer.
	sglangSession      string
	opensSGLangSession bool
	sglangSessionID    *openai.SGLangSessionIDReader
	objective          string // the objective header's value, if it can name one; "": none
	fairness           string // the fairness header's value, if it can name a flow; "": none
	// targetModel is the model-name rewrite header's value, if it can name a model, and
	// targetHeader the header that carried it; "": none.
	targetModel, targetHeader string

	// explainHeader: the request carried the explain header, removed before forwarding.
	// explainOff: the route does not answer it. explainValue: the decision to answer with.
	explainHeader, explainWanted, explainOff bool
	explainValue                             []byte

	upstreamStatus int
	sawFirstByte   bool
	// chunkAck answers every STREAMED response chunk (continue, unchanged): one message
	// per stream, sent again for each chunk, since Send has marshalled it on return.
	chunkAck *extprocv3.ProcessingResponse
	single   [1]*extprocv3.ProcessingResponse // the backing of one()
	// usageTail holds the response's last chunks, at least usageTailBytes of them, where
	// the usage object is: the chunks themselves (each message's own bytes), not copies.
	usageTail      [][]byte
	usageTailFrom  int // usageTail[:usageTailFrom] were let go
	usageTailBytes int

	// rename, when set, is the request's model rewrite, which the response's body
	// undoes (rename.go); nil for a request that was not rewritten, or whose response
	// body cannot be renamed.
	rename *rename
}

// handle answers one message from Envoy. A returned error ends the stream with that
// gRPC status (Envoy then applies status_on_error when failing closed).
func (st *stream) handle(ctx context.Context, req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
	if pc := req.GetProtocolConfig(); pc != nil {
		st.reqMode, st.respMode = bodyMode(pc.GetRequestBodyMode()), bodyMode(pc.GetResponseBodyMode())
		st.reqPartial = pc.GetRequestBodyMode() == extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL
		st.respPartial = pc.GetResponseBodyMode() == extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL
	}
	switch r := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		if st.phase != phaseRequestHeaders {
			return nil, status.Error(codes.FailedPrecondition, "request_headers received twice")
		}
		return st.onRequestHeaders(ctx, req, r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		if st.phase == phaseRequestHeaders {
			// Passed on, the request would go wherever the client's destination header says.
			return st.reject(errNoRequestHeaders), nil
		}
		return st.onRequestBody(ctx, r.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if st.phase == phaseRequestHeaders {
			return st.reject(errNoRequestHeaders), nil
		}
		return st.onRequestTrailers(ctx)
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return st.onResponseHeaders(req.GetMetadataContext(), r.ResponseHeaders), nil
	case *extprocv3.ProcessingRequest_ResponseBody:
		return st.onResponseBody(r.ResponseBody), nil
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		st.readUsage()
		st.release(st.finalOutcome())
		st.phase = phaseDone
		trailers := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
		if st.renaming() {
			return append(st.renameRest(), trailers), nil
		}
		return st.one(trailers), nil
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
	if st.kind == 0 {
		st.storedResponse = st.srv.storedResponseID(path)
	}
	// SGLang takes GET too, with the same body: routed by load at its headers, its
	// answer read as a POST's.
	st.opensSGLangSession = (method == "POST" || method == "GET") && st.srv.opensSessions[path]
	st.anthropic = st.kind == openai.Messages || st.srv.underMessagesPath(path)
	if st.srv.cfg.ModelHeader != "" {
		st.model = headerValue(h.GetHeaders(), st.srv.cfg.ModelHeader)
	}
	st.readMetadata(req.GetMetadataContext())
	st.readHeaders(h.GetHeaders(), h.GetEndOfStream())

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
	// The destination rides on the body reply, which Envoy applies only in BUFFERED. If
	// Envoy's mode is not what kvroute was told (an Envoy < 1.34 that does not announce
	// it, configured STREAMED), that mutation is ignored: strip any client-sent
	// destination now, so the request then finds no host (503) rather than the client's.
	return st.one(headersReply(&extprocv3.HeaderMutation{RemoveHeaders: []string{st.srv.cfg.DestinationHeader, st.srv.cfg.PrefillHeader, legacyPrefillHeader}})), nil
}

// legacyPrefillHeader is the prefill header of older llm-d routing sidecars, which
// newer ones still read when x-prefiller-host-port is absent ("backward compatible
// behavior", internal/proxy/chat_completions.go): kvroute never sets it, and removes it
// from every request it forwards, split or not, so a client cannot name a prefill
// worker through it.
const legacyPrefillHeader = "x-prefiller-url"

// readMetadata reads the GIE subset hint and kvroute's metadata-namespace override.
func (st *stream) readMetadata(md *corev3.Metadata) {
	fm := md.GetFilterMetadata()
	if hint, ok := fm[subsetNamespace]; ok {
		if v, ok := hint.GetFields()[subsetKey]; ok {
			st.subset = subsetEntries(v)
		}
	}
	if ns, ok := fm[MetadataNamespace]; ok && st.override == nil && st.overrideErr == nil {
		st.override, st.overrideErr = overrideFromStruct(st.srv.policy.Params(), ns)
	}
}

// subsetEntries reads the GIE subset hint's value: a list of "ip:port" strings, as the
// endpoint-picker protocol writes it (docs/proposals/004-endpoint-picker-protocol), or
// one comma-separated string, as a data plane that copies a header into the metadata
// writes it; a list entry may itself be comma-separated. GIE's reference picker reads
// both shapes (pkg/lwepp/handlers/request.go). The result is never nil: a hint present
// but naming nothing (an empty list or string, another value type) admits no worker.
// Entries that are addresses are written in the canonical form worker addresses are
// (IPv6 in lower case, compressed; IPv4-mapped as IPv4), so the router compares
// strings: "[FD00::1]:8000" names the worker at [fd00::1]:8000.
func subsetEntries(v *structpb.Value) []string {
	entries := []string{}
	add := func(s string) {
		for e := range strings.SplitSeq(s, ",") {
			if e = strings.TrimSpace(e); e != "" {
				entries = append(entries, canonicalEndpoint(e))
			}
		}
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		add(k.StringValue)
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			add(e.GetStringValue())
		}
	}
	return entries
}

// canonicalEndpoint writes an ip:port, or an IP (bracketed or not), in canonical form;
// anything else is returned as it is.
func canonicalEndpoint(e string) string {
	if ap, err := netip.ParseAddrPort(e); err == nil {
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String()
	}
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(e, "["), "]")); err == nil {
		return a.Unmap().String()
	}
	return e
}

// readHeaders reads the session, objective and explain request headers; endOfStream
// says the request has no body.
func (st *stream) readHeaders(h *corev3.HeaderMap, endOfStream bool) {
	for _, name := range st.srv.sessionHeaders {
		if st.session = headerValue(h, name); st.session != "" {
			break
		}
	}
	if !endOfStream {
		// A value no objective could have (over a Kubernetes name's 253 bytes, or
		// characters a name has not) names none, as an unknown name does: the request
		// has priority 0, and the client's bytes go no further. A request without a
		// body (its headers end it: a GET) names none either: GIE's endpoint picker
		// routes such a request before it reads any header (handlers/request.go,
		// HandleRequestHeaders, v1.0 to v1.5), so it is never shed. Sent several times,
		// the header's last value counts, as in GIE; of the header and its alias, the
		// first present (firstHeader). An absent header ("") is not validated: the check
		// would build its error, and most requests carry neither header.
		if v, _ := firstHeader(h, st.srv.objectiveHeaders); v != "" && priority.ValidName(v) == nil {
			st.objective = v
		}
		// The fairness id, read alike (flow control's flows): a value that cannot be one
		// (flowcontrol.ValidFairnessID) puts the request in the flow of requests
		// naming none.
		if v, _ := firstHeader(h, st.srv.fairnessHeaders); v != "" && flowcontrol.ValidFairnessID(v) {
			st.fairness = v
		}
		// The model-name rewrite header, read alike; a value no model could have (empty,
		// over 512 bytes, control characters) names none, and the body's model stands.
		// Only a body kvroute reads is rewritten (rewriteModel).
		if v, name := firstHeader(h, rewrite.HeaderNames()); v != "" && rewrite.ValidModel(v) == nil {
			st.targetModel, st.targetHeader = v, name
		}
	}
	value, present := lookupHeader(h, st.srv.explain.Header())
	st.explainHeader = present
	st.explainWanted = present && !st.explainOff && st.srv.explain.Wants(value)
}

func (st *stream) onRequestBody(ctx context.Context, b *extprocv3.HttpBody) ([]*extprocv3.ProcessingResponse, error) {
	if st.phase != phaseRequestBody {
		// A body kvroute does not read (routed at the headers): pass it on untouched.
		if st.reqMode == ModeFullDuplex {
			return streamedReplies(b.GetBody(), b.GetEndOfStream(), true), nil
		}
		return st.one(bodyReply(nil)), nil
	}
	if len(st.body)+len(b.GetBody()) > st.srv.cfg.MaxBodyBytes {
		return st.reject(fmt.Errorf("%w: the limit is %d bytes", ErrBodyTooLarge, st.srv.cfg.MaxBodyBytes)), nil
	}
	if st.body == nil && b.GetEndOfStream() {
		// The whole body in one message (BUFFERED, or a one-chunk stream): the message
		// is this stream's and nothing writes to it, so read it where it is rather than
		// copy it.
		st.body = b.GetBody()
	} else {
		st.body = append(st.body, b.GetBody()...)
	}
	if !b.GetEndOfStream() {
		switch {
		case st.reqMode == ModeBuffered && st.reqPartial:
			// BUFFERED_PARTIAL sends a body without end_of_stream both when it filled
			// Envoy's buffer (the rest goes upstream unseen) and when the request's
			// trailers came after a body that fit (ext_proc.cc, Filter::onTrailers).
			// Only a cut body ends inside its JSON document; a complete one is routed.
			if cutShort(st.body) {
				return st.reject(fmt.Errorf("%w: over the gateway's buffer limit", ErrBodyTooLarge)), nil
			}
			return st.routeByBody(ctx, false), nil
		case st.reqMode == ModeBuffered:
			// BUFFERED sends the whole body in one message (a larger one is Envoy's 413);
			// without end_of_stream, the request's trailers follow (ext_proc.cc,
			// Filter::onTrailers): the body is complete.
			return st.routeByBody(ctx, false), nil
		}
		return nil, nil
	}
	return st.routeByBody(ctx, true), nil
}

// onRequestTrailers ends a FULL_DUPLEX body that was not closed by end_of_stream.
func (st *stream) onRequestTrailers(ctx context.Context) ([]*extprocv3.ProcessingResponse, error) {
	trailers := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
	if st.phase != phaseRequestBody {
		return st.one(trailers), nil
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
	if err := ctx.Err(); err != nil {
		// Envoy gave up on the stream while its body waited for a CPU: under overload,
		// parsing and encoding for streams already gone is what keeps the backlog growing.
		return st.routeFailed(ctx, err)
	}
	// Bodies decoded at once are bounded (max_concurrent_body_bytes): each takes several
	// times its bytes while it is parsed, rendered and encoded, and a flood of large
	// ones would size kvroute's memory. One past the bound is routed by load on its
	// model alone (read without keeping the rest): served, never refused.
	var req router.Request
	outcome := "routed"
	if st.kind == openai.Responses || st.kind == openai.Messages {
		// Bodies vLLM converts to a chat before its template: routed on that chat when
		// kvroute rebuilds it, else by load on their model (never refused for it).
		var rebuild func() (router.Request, error)
		var err error
		req, rebuild, err = st.readConverted(body)
		if err != nil {
			return st.reject(err)
		}
		outcome = "load_only"
		switch {
		case rebuild == nil:
		case !st.srv.bodies.take(len(body)):
			outcome = outcomeBodiesBusy
		default:
			// Held until routed, as a chat body: the rebuilt chat is rendered and
			// encoded in Route.
			defer st.srv.bodies.give(len(body))
			if rebuilt, err := rebuild(); err == nil {
				req, outcome = rebuilt, "routed"
			} else {
				st.srv.log.Debug("body routed by load", "api", st.kind.String(), "error", err)
			}
		}
	} else if st.srv.bodies.take(len(body)) {
		defer st.srv.bodies.give(len(body))
		parsed, err := openai.Parse(st.kind, body, st.srv.cfg.limits())
		if err != nil {
			return st.reject(err)
		}
		req = RouteRequest(parsed, body)
		st.bodySessions(parsed.SGLangSession, parsed.SessionKey)
		switch st.kind {
		case openai.SGLangOpenSession, openai.SGLangCloseSession:
			outcome = "load_only" // no prompt
			fallthrough
		case openai.Generate, openai.SGLangGenerate:
			req.Body = nil // no engine renders these bodies
		}
	} else if st.kind == openai.SGLangGenerate || st.kind == openai.SGLangOpenSession || st.kind == openai.SGLangCloseSession {
		// Routed by load without their model (they name none), but to the engine that
		// holds the session they name, if any: every other engine aborts them.
		session, key, err := openai.ParseSGLangSessions(st.kind, body, st.srv.cfg.limits())
		if err != nil {
			return st.reject(err)
		}
		st.bodySessions(session, key)
		req, outcome = router.Request{Tokens: []uint32{}}, outcomeBodiesBusy
	} else {
		parseModel := openai.ParseModel
		if st.kind == openai.Generate {
			parseModel = openai.ParseGenerateModel
		}
		model, err := parseModel(body, st.srv.cfg.limits())
		if err != nil {
			return st.reject(err)
		}
		req, outcome = router.Request{Model: model, Tokens: []uint32{}}, outcomeBodiesBusy
	}
	forward, rewritten, err := st.rewriteModel(&req, body)
	if err != nil {
		return st.reject(err)
	}
	if rewritten {
		st.rename = &rename{requested: req.RequestedModel, target: req.Model}
	}
	if req.Model == "" {
		// A generate body need not name its model (the engine serves its own): the
		// model header's, when the gateway gives one, else default_model, else any
		// worker, by load.
		req = st.unnamedModel(req)
		if req.AnyModel && outcome == "routed" {
			outcome = "load_only"
		}
	}
	// llm-d's routing sidecar splits the OpenAI APIs and vLLM's generate; it passes
	// SGLang's /generate (and its session requests) to the decode engine whole.
	req.Whole = st.kind == openai.SGLangGenerate || st.kind == openai.SGLangOpenSession || st.kind == openai.SGLangCloseSession
	parseTime := st.srv.now().Sub(start)
	d, err := st.srv.router.Route(ctx, st.fromGateway(&req))
	if err != nil {
		return st.routeFailed(ctx, err)
	}
	st.srv.metrics.decided(d, parseTime)
	if st.kind == openai.Responses || st.kind == openai.Messages {
		st.srv.metrics.convertedRequest(st.kind.String(), outcome)
	}
	if st.srv.log.Enabled(ctx, slog.LevelDebug) {
		st.srv.log.Debug("routed", "worker", d.Worker, "decision", explain.Of(d, 0))
	}
	if st.reqMode == ModeBuffered {
		// BUFFERED applies a header mutation carried by the body reply (ENVOY.md §3).
		reply := bodyReply
		if rewritten {
			reply = func(m *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse { return replacedBodyReply(m, forward) }
		}
		return st.one(st.accept(d, outcome, reply))
	}
	return append(st.one(st.accept(d, outcome, headersReply)), streamedReplies(forward, endOfStream, true)...)
}

// readConverted reads a Responses or Messages API body's routing fields: the load-only
// request for its model, and the rebuild of the chat vLLM renders for it, nil when it
// has none (a Responses body naming a stored response goes to the worker that stored
// it: its prompt is the engine's stored history). An error is the client's.
func (st *stream) readConverted(body []byte) (router.Request, func() (router.Request, error), error) {
	lim := st.srv.cfg.limits()
	if st.kind == openai.Messages {
		parsed, err := openai.ParseMessages(body, lim)
		if err != nil {
			return router.Request{}, nil, err
		}
		return router.Request{Model: parsed.Model, Tokens: []uint32{}},
			func() (router.Request, error) { return MessagesRouteRequest(parsed, body, lim) }, nil
	}
	parsed, err := openai.ParseResponses(body, lim)
	if err != nil {
		return router.Request{}, nil, err
	}
	st.storedResponse, st.storesResponse = parsed.PreviousResponseID, parsed.Store
	loadOnly := router.Request{Model: parsed.Model, Tokens: []uint32{}}
	if parsed.PreviousResponseID != "" {
		return loadOnly, nil, nil
	}
	return loadOnly, func() (router.Request, error) { return ResponsesRouteRequest(parsed, body, lim) }, nil
}

// bodySessions takes the sessions a body names: the SGLang session its engine holds,
// and its own session identity (SGLang's session_id), which names the request's
// session, as a session header's value does, when session affinity is on and no
// header names one.
func (st *stream) bodySessions(sglangSession, key string) {
	st.sglangSession = sglangSession
	if st.session == "" && len(st.srv.sessionHeaders) > 0 {
		st.session = key
	}
}

// MessagesRouteRequest is what a parsed Anthropic Messages API body routes on: the
// chat vLLM converts it to and renders as a chat completion (openai.MessagesChat),
// with its cache_salt, encoded as a chat completion's (no special tokens added: vLLM
// runs the converted request through its chat-completions path). The body comes
// along (Body, BodyAPI messages) for a model whose engine renders its prompts: that
// model's ids are the engine's render of the body (/v1/messages/render), not of the
// rebuilt chat. When the chat is not rebuilt it returns the load-only request and
// why, an error wrapping openai.ErrMessagesNotRendered: the request is routed by load,
// never refused for it.
func MessagesRouteRequest(parsed openai.MessagesRequest, body []byte, lim openai.Limits) (router.Request, error) {
	chat, err := openai.MessagesChat(body, lim)
	if err != nil {
		return router.Request{Model: parsed.Model, Tokens: []uint32{}}, err
	}
	return router.Request{Model: parsed.Model, CacheSalt: parsed.CacheSalt, Chat: chat, Rebuilt: true, MaxTokens: parsed.MaxTokens,
		Body: body, BodyAPI: openai.Messages}, nil
}

// ResponsesRouteRequest is what a parsed Responses API body routes on, as RouteRequest
// is for chat and completions bodies: its prompt, rebuilt as the chat vLLM renders
// for it (openai.ResponsesChat), and its cache salt. The body comes along (Body,
// BodyAPI responses) for a model whose engine renders its prompts: that model's ids
// are the engine's render of the body (/v1/responses/render), not of the rebuilt
// chat. A body naming a stored response (previous_response_id) is never sent there:
// vLLM's render is stateless and refuses it. When the prompt is not rebuilt (the body
// continues a stored response, or holds what the rebuild does not take), it returns
// the load-only request and why, an error wrapping openai.ErrResponsesNotRendered: the
// request is routed by load, never refused for it.
func ResponsesRouteRequest(parsed openai.ResponsesRequest, body []byte, lim openai.Limits) (router.Request, error) {
	chat, err := openai.ResponsesChat(body, lim)
	if err != nil {
		// The body was parsed: a shape the rebuild does not take, which the engine judges.
		return router.Request{Model: parsed.Model, Tokens: []uint32{}}, err
	}
	// vLLM encodes a Responses request's rendered chat with ResponsesRequest's
	// build_tok_params, which leaves add_special_tokens at TokenizeParams' default,
	// true (a chat completion's defaults to false): a tokenizer that adds a BOS adds
	// one before the template's own.
	addSpecialTokens := true
	// ResponsesChat refuses a body naming a stored response, so this body is one
	// vLLM's stateless render takes.
	return router.Request{Model: parsed.Model, CacheSalt: parsed.CacheSalt, Chat: chat, Rebuilt: true,
		AddSpecialTokens: &addSpecialTokens, Body: body, BodyAPI: openai.Responses}, nil
}

// rewriteModel sets req's target model, as llm-d-router's picker does (requestcontrol/
// director.go, modelRewriteIfNeeded): the model-name rewrite header names it, and a
// model rewrite matching the body's model, if any, overrides that. req is routed on the
// target, and the body to forward (returned) carries it in its "model", every other
// byte as the client sent it. rewritten reports whether that body differs from body: a
// request with no target, or whose target is its own model, is forwarded as it came.
func (st *stream) rewriteModel(req *router.Request, body []byte) (forward []byte, rewritten bool, err error) {
	if st.srv.rewrites == nil && st.targetModel == "" {
		return body, false, nil // nothing could rewrite it: most requests
	}
	if rewrite.ValidModel(req.Model) != nil {
		// A model no model could have (over 512 bytes, control characters) is not
		// rewritten, by a rule or the header: the response would carry it back in each
		// event. Routed on itself, it finds no worker.
		return body, false, nil
	}
	var choice rewrite.Choice
	matched := false
	if st.srv.rewrites != nil {
		choice, matched = st.srv.rewrites.Choose(req.Model)
	}
	var target string
	switch {
	case matched:
		req.Rewrite, target = choice.Rewrite, choice.Target
	case st.targetModel != "":
		req.RewriteHeader, target = st.targetHeader, st.targetModel
	default:
		return body, false, nil
	}
	req.RequestedModel = req.Model
	if target == req.Model {
		return body, false, nil
	}
	if forward, err = openai.SetModel(body, target, st.srv.cfg.limits()); err != nil {
		return nil, false, err // the body was parsed: it gives its model more than once
	}
	req.Model = target
	if req.Body != nil {
		req.Body = forward // a render endpoint sees what the engine will
	}
	return forward, true, nil
}

// fromGateway adds to req what the gateway's headers and route say of it: the policy
// override, the GIE subset, the session and the objective; and the stored response the
// request names, by its path or its body.
func (st *stream) fromGateway(req *router.Request) *router.Request {
	req.Subset, req.Session, req.Objective, req.FairnessID = st.subset, st.session, st.objective, st.fairness
	if st.override != nil {
		req.Override = st.override.apply
	}
	req.PreviousResponseID, req.SGLangSession = st.storedResponse, st.sglangSession
	req.OpensSGLangSession = st.kind == openai.SGLangOpenSession
	if st.srv.heldMessageTimeout > 0 && st.reqMode != ModeFullDuplex && st.send != nil {
		req.OnHeld = st.lengthenMessageTimer
	}
	return req
}

// lengthenMessageTimer asks Envoy to restart the timer of the message kvroute is
// answering at flow_control.override_message_timeout, as flow control holds the
// request: without it Envoy answers 504 once message_timeout passes. Envoy ignores
// other fields of such a reply, honours one per message, and only with its
// max_message_timeout at least as long. A failed send is left to the reply that
// follows, which fails too.
func (st *stream) lengthenMessageTimer() {
	reply := &extprocv3.ProcessingResponse{OverrideMessageTimeout: durationpb.New(st.srv.heldMessageTimeout)}
	if err := st.send(reply); err != nil {
		st.srv.log.Debug("override_message_timeout not sent", "error", err)
	}
}

// outcomeBodiesBusy is the requests_total outcome of a body routed by load because
// max_concurrent_body_bytes left no room to decode it.
const outcomeBodiesBusy = "load_only_busy"

// bodyBudget bounds the bytes of the bodies decoded at once. The zero value (max 0)
// bounds nothing.
type bodyBudget struct {
	max   int64
	inUse atomic.Int64
}

// take reserves n bytes, or reports that they do not fit.
func (b *bodyBudget) take(n int) bool {
	if b.max == 0 {
		return true
	}
	for {
		used := b.inUse.Load()
		if used+int64(n) > b.max {
			return false
		}
		if b.inUse.CompareAndSwap(used, used+int64(n)) {
			return true
		}
	}
}

// give returns n bytes take reserved.
func (b *bodyBudget) give(n int) {
	if b.max != 0 {
		b.inUse.Add(-int64(n))
	}
}

// RouteRequest is what a parsed request body routes on: its model, cache salt and
// prompt, and the fields that change how the engine encodes it. The filter adds the
// gateway's part (policy override, subset, session); `extproc tokenize` shows what a
// body routes on through it, so the two encode one prompt.
func RouteRequest(parsed openai.Request, body []byte) router.Request {
	return router.Request{Model: parsed.Model, LoRA: parsed.LoRA, CacheSalt: parsed.CacheSalt, Tokens: parsed.Tokens, Chat: parsed.Chat,
		Prompt: parsed.Prompt, Body: body, AddSpecialTokens: parsed.AddSpecialTokens, TruncatePromptTokens: parsed.TruncatePromptTokens,
		MaxTokens: parsed.MaxTokens, Unsupported: parsed.Unsupported, Sequences: parsed.Sequences}
}

// unnamedModel is the request for a body that names no model (a generate body, whose
// engine serves its own model): routed on its prompt for the model header's model when
// the request has one, else for default_model, else by load over every worker,
// whatever they serve. kvroute does not guess the model from the fleet: a prompt's
// blocks are hashed in its model's namespace, and a guess would put them in the wrong
// one.
func (st *stream) unnamedModel(req router.Request) router.Request {
	if model := cmp.Or(st.model, st.srv.cfg.DefaultModel); model != "" {
		// The engine serves a body without model on its base model, no adapter
		// (vLLM's _maybe_get_adapters): a header naming an adapter routes for its base.
		// SGLang's body names its adapter apart (lora_path: req.LoRA).
		req.Model, req.BaseOnly = model, true
		return req
	}
	return router.Request{AnyModel: true, Tokens: []uint32{}, Sequences: req.Sequences}
}

// routeByLoad routes a request without reading its body and answers its headers; any
// body that follows passes through onRequestBody untouched. The model header, when
// present, restricts the candidates to the workers serving that model (none: 404);
// without it every worker is a candidate.
func (st *stream) routeByLoad(ctx context.Context) []*extprocv3.ProcessingResponse {
	// A Responses API POST whose body is not read (an Envoy body mode that shows none)
	// stores its response unless the body said store false: its id is still read.
	st.storesResponse = st.kind == openai.Responses
	d, err := st.srv.router.Route(ctx, st.fromGateway(&router.Request{Model: st.model, AnyModel: st.model == "", Tokens: []uint32{}}))
	if err != nil {
		return st.routeFailed(ctx, err)
	}
	return st.one(st.accept(d, "load_only", headersReply))
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
	// OVERWRITE_IF_EXISTS_OR_ADD replaces every client-sent value: Envoys that honour
	// append_action (mutation_utils.cc) overwrite with it, older ones ignore it and
	// overwrite anyway.
	mutation := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
		Header:       &corev3.HeaderValue{Key: st.srv.cfg.DestinationHeader, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}}}
	// The prefill header names kvroute's prefill worker or nothing: a client's value
	// would send the prompt (and the KV transfer) wherever the client likes.
	if d.Prefill != nil {
		mutation.SetHeaders = append(mutation.SetHeaders, &corev3.HeaderValueOption{
			Header:       &corev3.HeaderValue{Key: st.srv.cfg.PrefillHeader, RawValue: []byte(d.Prefill.Address)},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		})
		mutation.RemoveHeaders = st.srv.removeSplit
	} else {
		mutation.RemoveHeaders = st.srv.removeUnsplit
	}
	st.explainDecision(d, mutation)
	r := reply(mutation)
	r.DynamicMetadata = lbMetadataStruct(value)
	return r
}

// explainDecision offers the decision to the admin port's sample and, when the request
// asked for it, keeps its trace for the response headers. The explain header itself is
// removed from the request: it is kvroute's, not the worker's.
func (st *stream) explainDecision(d *router.Decision, mutation *extprocv3.HeaderMutation) {
	st.srv.explain.Observe(d)
	if st.explainHeader {
		mutation.RemoveHeaders = append(mutation.RemoveHeaders, st.srv.explain.Header())
	}
	if !st.explainWanted {
		return
	}
	value, err := explain.HeaderValue(d)
	if err != nil {
		st.srv.log.Warn("explain: decision not answered", "worker", d.Worker, "error", err)
		return
	}
	st.explainValue = value
}

// observeHealth passes the upstream status to the health tracker, for worker at
// address: the one that served. A split request's status may be its prefill worker's,
// passed on by the decode worker's sidecar, and nothing in the response says which: a
// success counts for both, a failure for neither (the active probes find a failing
// worker), so one broken prefill worker cannot take every decode worker out.
func (st *stream) observeHealth(worker, address string) {
	if st.srv.health == nil {
		return
	}
	d := st.decision
	if d.Prefill == nil {
		st.srv.health.Observe(worker, address, st.upstreamStatus)
		return
	}
	if st.upstreamStatus >= 200 && st.upstreamStatus < 300 {
		st.srv.health.Observe(worker, address, st.upstreamStatus)
		st.srv.health.Observe(d.Prefill.Worker, d.Prefill.Address, st.upstreamStatus)
	}
}

// served follows the response to the endpoint that served it. A response the data plane
// reports served by another of the decision's candidates (a fallback, listed in the
// destination or past fallback_endpoints) moves the request there
// (router.Decision.Served) and its status counts for that worker's health; one served
// by an endpoint that was none of them counts for nobody's. It reports whether the
// worker that served is known (the decision's ServedWorker): false for such an endpoint.
func (st *stream) served(md *corev3.Metadata) bool {
	d := st.decision
	other, elsewhere := servedElsewhere(md, d.Address)
	if !elsewhere {
		st.observeHealth(d.Worker, d.Address)
		return true
	}
	worker, moved, err := d.Served(other)
	if err != nil {
		st.srv.log.Warn("a request served by a fallback: its blocks not moved", "worker", worker, "error", err)
	}
	if !moved {
		st.srv.metrics.servedElsewhere("unlisted")
		return false
	}
	st.srv.metrics.servedElsewhere("moved")
	st.observeHealth(worker, other)
	return true
}

func (st *stream) onResponseHeaders(md *corev3.Metadata, h *extprocv3.HttpHeaders) []*extprocv3.ProcessingResponse {
	st.upstreamStatus, _ = strconv.Atoi(headerValue(h.GetHeaders(), ":status"))
	if st.decision != nil && st.phase == phaseResponseHeaders { // once per response
		// The sidecar answers only after the prefill worker did: its part is over,
		// whether the response streams or comes whole at the end of generation.
		st.decision.PrefillerDone()
		// A stored response's id is read from a success, once, when kvroute knows the
		// worker that served it: one the data plane picked outside the decision stored
		// it, not the chosen worker, whose engine would answer 404 for it.
		if st.served(md) && st.upstreamStatus >= 200 && st.upstreamStatus < 300 {
			st.learnFromSuccess()
		}
		if st.upstreamStatus >= 400 {
			// The engine did not compute the prompt: its blocks are not in its cache.
			if err := st.decision.Refused(); err != nil {
				st.srv.log.Warn("a refused request: its blocks not forgotten", "worker", st.decision.ServedWorker(), "error", err)
			}
		}
	}
	common := &extprocv3.CommonResponse{}
	if st.explainValue != nil {
		// The response headers reply is where a response header can be set in every
		// body mode (ENVOY.md §3: body replies' mutations apply only in BUFFERED).
		common.HeaderMutation = &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
			Header: &corev3.HeaderValue{Key: explain.ResponseHeader, RawValue: st.explainValue},
		}}}
		st.explainValue = nil
	}
	reply := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{Response: common},
	}}
	st.phase = phaseResponseBody
	if st.rename != nil {
		st.startRename(h)
	}
	if h.GetEndOfStream() || st.respMode == ModeNone {
		// No body will be seen: the response headers are the last sign of the request.
		st.release(st.finalOutcome())
		st.phase = phaseDone
	}
	return st.one(reply)
}

// servedElsewhere reports the endpoint that served the response when the data plane
// names another than address, the chosen worker's: a GIE data plane names it in
// envoy.lb / x-gateway-destination-endpoint-served on the response
// (docs/proposals/004-endpoint-picker-protocol, "Destination Endpoint Served"), a
// fallback when the chosen worker could not take the request. Without that entry the
// response is the chosen worker's, and so it is with an empty entry (a data plane's own
// error reply names no endpoint). Addresses are compared as addresses, so another
// spelling of the chosen worker's IP is still the chosen worker; the endpoint returned
// is in canonical form, as worker addresses are written, when it parses.
func servedElsewhere(md *corev3.Metadata, address string) (string, bool) {
	v, ok := md.GetFilterMetadata()[lbNamespace].GetFields()[servedMDKey]
	if !ok {
		return "", false
	}
	served := strings.TrimSpace(v.GetStringValue())
	if served == "" || served == address {
		return "", false
	}
	a, err := netip.ParseAddrPort(served)
	if err != nil {
		return served, true
	}
	a = netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
	if b, err := netip.ParseAddrPort(address); err == nil && a == netip.AddrPortFrom(b.Addr().Unmap(), b.Port()) {
		return "", false
	}
	return a.String(), true
}

func (st *stream) onResponseBody(b *extprocv3.HttpBody) []*extprocv3.ProcessingResponse {
	chunk := b.GetBody()
	if st.decision != nil && len(chunk) > 0 && !st.sawFirstByte {
		st.sawFirstByte = true
		st.decision.FirstToken()
	}
	st.keepTail(chunk)
	st.readResponseID(chunk)
	var replies []*extprocv3.ProcessingResponse
	switch {
	case st.renaming():
		replies = st.renamedBody(chunk, b.GetEndOfStream())
	case st.respMode == ModeFullDuplex:
		replies = streamedReplies(chunk, b.GetEndOfStream(), false)
	default:
		replies = st.one(st.bodyAck())
	}
	if b.GetEndOfStream() {
		st.readUsage()
		st.release(st.finalOutcome())
		st.phase = phaseDone
	}
	return replies
}

// learnFromSuccess notes what a successful answer says the serving worker's engine
// now holds: the Responses API response it stored and the SGLang session it opened
// (both ids read from the body), and the SGLang session whose turn it served. Only
// a worker kvroute knows served it (stream.served): one the data plane picked outside
// the decision holds them, not the chosen worker.
func (st *stream) learnFromSuccess() {
	if st.storesResponse {
		st.responseID = &openai.ResponseIDReader{}
	}
	if st.opensSGLangSession {
		st.sglangSessionID = &openai.SGLangSessionIDReader{}
	}
	// A turn sent to its session's engine keeps the session from being forgotten
	// (responses.ttl) while in use. A turn routed by load teaches nothing: SGLang
	// answers 200 to one it aborts for an unknown session when it streams (the abort
	// is in its events), and older releases when it does not.
	if st.kind == openai.SGLangGenerate && st.decision.SGLangSession == router.StoredResponseWorker {
		st.decision.RememberSGLangSession(st.sglangSession)
	}
}

// readResponseID reads the id of the response the engine stored, or of the SGLang
// session it opened, from the response's first bytes, and remembers the worker that
// served it (router.Decision.RememberResponse, RememberSGLangSession).
func (st *stream) readResponseID(chunk []byte) {
	if st.responseID != nil {
		if id, done := st.responseID.Write(chunk); done {
			st.responseID = nil
			st.decision.RememberResponse(id)
		}
	}
	if st.sglangSessionID != nil {
		if id, done := st.sglangSessionID.Write(chunk); done {
			st.sglangSessionID = nil
			st.decision.RememberSGLangSession(id)
		}
	}
}

// bodyAck is the reply that passes a STREAMED or BUFFERED response chunk unchanged.
func (st *stream) bodyAck() *extprocv3.ProcessingResponse {
	if st.chunkAck == nil {
		st.chunkAck = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
			ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}},
		}}
	}
	return st.chunkAck
}

// keepTail keeps the response's last chunks, at least usageTailBytes of them, where the
// usage object is. A chunk is a received message's own bytes, which nothing writes to:
// keeping it costs no copy, and older chunks are let go as newer ones arrive.
func (st *stream) keepTail(chunk []byte) {
	if len(chunk) == 0 {
		return
	}
	if len(st.usageTail) == cap(st.usageTail) && st.usageTailFrom > 0 {
		// Reuse the room of chunks let go rather than grow the list.
		n := copy(st.usageTail, st.usageTail[st.usageTailFrom:])
		clear(st.usageTail[n:])
		st.usageTail, st.usageTailFrom = st.usageTail[:n], 0
	}
	st.usageTail = append(st.usageTail, chunk)
	st.usageTailBytes += len(chunk)
	for len(st.usageTail)-st.usageTailFrom > 1 && st.usageTailBytes-len(st.usageTail[st.usageTailFrom]) >= usageTailBytes {
		st.usageTailBytes -= len(st.usageTail[st.usageTailFrom])
		st.usageTail[st.usageTailFrom] = nil
		st.usageTailFrom++
	}
}

// tail returns the end of the response where its last usage object is: from the last
// kept chunk that holds a whole "usage" key to the end, or every kept chunk when none
// does (the key cut across two chunks). Only a usage split across chunks costs a copy.
func (st *stream) tail() []byte {
	kept := st.usageTail[st.usageTailFrom:]
	key := []byte(`"usage"`)
	from := 0
	for i := len(kept) - 1; i >= 0; i-- {
		if bytes.Contains(kept[i], key) {
			from = i
			break
		}
	}
	if from == len(kept)-1 {
		return kept[from]
	}
	return bytes.Join(kept[from:], nil)
}

// readUsage counts the engine's reported usage, unless its values cannot be trusted:
// those are counted as rejected and logged, never added to the totals.
func (st *stream) readUsage() {
	if len(st.usageTail) == st.usageTailFrom {
		return
	}
	u, found, err := openai.ParseUsage(st.tail())
	switch {
	case err != nil:
		st.srv.metrics.usageRejected()
		worker := ""
		if st.decision != nil {
			worker = st.decision.ServedWorker() // the engine that answered
		}
		st.srv.log.Warn("usage rejected", "worker", worker, "error", err)
	case found:
		st.srv.metrics.usage(u.PromptTokens, u.CachedTokens)
	}
	st.usageTail, st.usageTailFrom, st.usageTailBytes = nil, 0, 0
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
		st.srv.metrics.released(st.decision.ServedWorker(), outcome)
	}
}

// reject answers with an OpenAI error as an immediate response and ends the stream.
// routeFailed answers a request the router did not route. When the stream itself is
// gone (Envoy gave up on it, past its message_timeout, while the prompt was encoded),
// nobody reads a reply and the request failed for no fault of kvroute's or the
// client's: it is counted as cancelled, not as an error.
func (st *stream) routeFailed(ctx context.Context, err error) []*extprocv3.ProcessingResponse {
	if ctx.Err() != nil {
		st.srv.metrics.request(outcomeCancelled)
		st.phase = phaseDone
		return nil
	}
	return st.reject(err)
}

func (st *stream) reject(err error) []*extprocv3.ProcessingResponse {
	apiErr := toAPIError(err)
	apiErr.anthropic = st.anthropic
	st.srv.metrics.request(apiErr.code)
	switch {
	case errors.Is(err, ErrBadOverride), errors.Is(err, router.ErrOnlyPrefillWorkers), errors.Is(err, errNoRequestHeaders):
		// The route's policy, the fleet's roles and Envoy's processing mode are operator
		// config, not request content (the model named is one the fleet serves).
		st.srv.log.Error("request failed", "code", apiErr.code, "error", err)
	case apiErr.status >= 500 && !errors.Is(err, router.ErrNoWorkers):
		// An internal error may quote the request (a template's or a tokenizer's
		// message): no request content below debug level.
		st.srv.log.Error("request failed", "code", apiErr.code, "error_type", fmt.Sprintf("%T", err))
		st.srv.log.Debug("request failed", "code", apiErr.code, "error", err)
	}
	st.phase = phaseDone
	return st.one(immediateReply(apiErr))
}

// one returns r as the only reply, in the stream's own one-element slice: a message
// costs no allocation for its list of replies. The slice is valid until the next handle
// call (Process sends every reply before it reads the next message).
func (st *stream) one(r *extprocv3.ProcessingResponse) []*extprocv3.ProcessingResponse {
	st.single[0] = r
	return st.single[:]
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
