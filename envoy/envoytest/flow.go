package envoytest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

const chunkSize = 32 << 10

// Body send modes, shortened.
const (
	none       = extprocfilterv3.ProcessingMode_NONE
	streamed   = extprocfilterv3.ProcessingMode_STREAMED
	buffered   = extprocfilterv3.ProcessingMode_BUFFERED
	partial    = extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL
	fullDuplex = extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	skip       = extprocfilterv3.ProcessingMode_SKIP
)

// errLocalReply stops a flow after a local reply has been written.
var errLocalReply = errors.New("local reply sent")

// flow is one HTTP request through the data plane.
type flow struct {
	s  *Server
	w  http.ResponseWriter
	r  *http.Request
	ex *Exchange
	// cancel ends the request's context: the processor stream and the upstream request
	// (Envoy resetting the stream when one side fails).
	cancel context.CancelFunc
	mu     sync.Mutex
	proc   *processor // nil once the processor is ignored (fail open or clean close)
	md     *corev3.Metadata
	// wrote is set once the client has been sent a status: later failures can only
	// reset the stream, as in Envoy.
	wrote bool
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	s.inflight.Add(1)
	defer s.inflight.Done()
	f := &flow{s: s, w: w, r: r, ex: &Exchange{Path: r.URL.Path, DynamicMetadata: map[string]*structpb.Struct{}}}
	defer func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		s.record(f.ex)
	}()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	f.cancel = cancel
	if err := f.run(ctx); err != nil && !errors.Is(err, errLocalReply) {
		if f.wrote {
			panic(http.ErrAbortHandler) // the response has started: reset it
		}
		f.localReply(http.StatusInternalServerError, err.Error())
	}
}

func (f *flow) run(ctx context.Context) error {
	cfg := &f.s.Config
	mode := cfg.ProcessingMode
	route := f.s.route(f.r.URL.Path)
	f.md = forwardedMetadata(route, cfg.ForwardingNamespaces)
	if len(route.GRPCInitialMetadata) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, metadata.New(route.GRPCInitialMetadata))
	}
	stream, err := extprocv3.NewExternalProcessorClient(f.s.conn).Process(ctx)
	if err != nil {
		if err := f.processorFailed(err); err != nil {
			return err
		}
	} else {
		f.proc = &processor{stream: stream, ex: f.ex, mu: &f.mu, first: true, onSent: cfg.OnProcessorMessage, maxMessageTimeout: cfg.MaxMessageTimeout}
		if cfg.SendProtocolConfig {
			f.proc.pc = &extprocv3.ProtocolConfiguration{RequestBodyMode: mode.GetRequestBodyMode(), ResponseBodyMode: mode.GetResponseBodyMode()}
		}
		f.proc.start()
		defer func() { _ = stream.CloseSend() }()
	}

	headers := fromHTTP(f.r.Header)
	headers[":method"] = []string{f.r.Method}
	headers[":path"] = []string{f.r.URL.RequestURI()}
	headers[":authority"] = []string{f.r.Host}
	headers[":scheme"] = []string{"http"}
	body, err := f.requestPhase(ctx, headers)
	if err != nil {
		return err
	}
	return f.forward(ctx, headers, body)
}

// requestPhase runs the request headers and body through the processor in the
// configured mode and returns the body to forward.
func (f *flow) requestPhase(ctx context.Context, h headerMap) ([]byte, error) {
	hasBody := f.r.ContentLength != 0
	bodyMode := f.bodyMode(true)
	if f.proc == nil {
		bodyMode = none
	}
	if bodyMode == fullDuplex {
		return f.requestFullDuplex(ctx, h, hasBody)
	}
	if f.headersSent(true) {
		msg := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
			RequestHeaders: &extprocv3.HttpHeaders{Headers: h.proto(), EndOfStream: !hasBody}}}
		if err := f.exchangeHeaders(ctx, msg, h, true); err != nil {
			return nil, err
		}
	}
	f.dropContentLength(h, true)
	if !hasBody {
		return nil, nil
	}
	switch bodyMode {
	case buffered:
		// The body is held up to the connection buffer limit; past it Envoy answers 413
		// (ENVOY.md §4).
		body, err := io.ReadAll(io.LimitReader(f.r.Body, int64(f.s.Config.BufferLimit)+1))
		if err != nil {
			return nil, err
		}
		if len(body) > f.s.Config.BufferLimit {
			// The filter manager's reply (filter_manager.cc,
			// ActiveStreamDecoderFilter::requestDataTooLarge), through the processor.
			return nil, f.routerReply(ctx, http.StatusRequestEntityTooLarge, "Payload Too Large")
		}
		return f.exchangeBody(ctx, h, body, true, true)
	case partial:
		out, more, err := f.partialBody(ctx, h, f.r.Body, f.r.ContentLength, true)
		if err != nil || !more {
			return out, err
		}
		rest, err := io.ReadAll(f.r.Body)
		return append(out, rest...), err
	case streamed:
		var out []byte
		buf := make([]byte, chunkSize)
		for {
			n, readErr := f.r.Body.Read(buf)
			eos := errors.Is(readErr, io.EOF)
			if n > 0 || eos {
				chunk, err := f.exchangeBody(ctx, h, bytes.Clone(buf[:n]), eos, true)
				if err != nil {
					return nil, err
				}
				out = append(out, chunk...)
			}
			if eos {
				return out, nil
			}
			if readErr != nil {
				return nil, readErr
			}
		}
	default:
		return io.ReadAll(f.r.Body)
	}
}

// exchangeHeaders sends a headers message and applies its reply to h.
func (f *flow) exchangeHeaders(ctx context.Context, msg *extprocv3.ProcessingRequest, h headerMap, request bool) error {
	if f.proc == nil {
		return nil
	}
	msg.MetadataContext = f.md
	reply, err := f.roundTrip(ctx, msg, f.s.Config.MessageTimeout)
	if err != nil || reply == nil {
		return err
	}
	var common *extprocv3.CommonResponse
	if request {
		r, ok := reply.GetResponse().(*extprocv3.ProcessingResponse_RequestHeaders)
		if !ok {
			return f.spurious(reply, "request_headers")
		}
		common = r.RequestHeaders.GetResponse()
	} else {
		r, ok := reply.GetResponse().(*extprocv3.ProcessingResponse_ResponseHeaders)
		if !ok {
			return f.spurious(reply, "response_headers")
		}
		common = r.ResponseHeaders.GetResponse()
	}
	return f.applyCommon(common, h, request)
}

// partialBody runs a body through the processor in BUFFERED_PARTIAL (ext_proc.cc,
// handleDataBufferedPartialMode): it is queued until it ends or the queue passes the
// buffer limit, then what is queued goes out in one message, with end_of_stream only
// if the body ended there; the rest of a larger body goes on unseen (more: r holds
// it). No 413. contentLength is the body's length if known (-1 if not).
func (f *flow) partialBody(ctx context.Context, h headerMap, r io.Reader, contentLength int64, request bool) (out []byte, more bool, err error) {
	limit := f.s.Config.BufferLimit
	head, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return nil, false, err
	}
	eos := len(head) <= limit || int64(len(head)) == contentLength
	out, err = f.exchangeBody(ctx, h, head, eos, request)
	return out, !eos, err
}

// exchangeBody sends one body message (BUFFERED or STREAMED) and returns the body Envoy
// forwards after the reply.
func (f *flow) exchangeBody(ctx context.Context, h headerMap, chunk []byte, eos, request bool) ([]byte, error) {
	if f.proc == nil {
		return chunk, nil
	}
	msg := bodyMessage(&extprocv3.HttpBody{Body: chunk, EndOfStream: eos}, request)
	msg.MetadataContext = f.md
	reply, err := f.roundTrip(ctx, msg, f.s.Config.MessageTimeout)
	if err != nil || reply == nil {
		return chunk, err
	}
	// Failing open, a spurious reply leaves the processor out and the chunk goes on as it
	// came (ext_proc.cc, onReceiveMessage: clearAsyncState, which injects the data held
	// for the processor).
	passOn := func(err error) ([]byte, error) {
		if err != nil {
			return nil, err
		}
		return chunk, nil
	}
	common, ok := bodyReplyOf(reply, request)
	if !ok {
		return passOn(f.spurious(reply, "body"))
	}
	mode := f.bodyMode(request)
	// A body reply's header mutation applies in BUFFERED and BUFFERED_PARTIAL, to the
	// headers Envoy still holds: none when the header mode is SKIP (processor_state.cc,
	// processHeaderMutationIfAvailable: "headers aren't available"); STREAMED ignores it
	// (handleStreamedBodyResponse).
	headersHeld := f.headersSent(request)
	switch {
	case mode == streamed:
		f.ignoreMutation(common, "header mutation in a STREAMED body reply")
	case !headersHeld:
		f.ignoreMutation(common, "header mutation in a body reply whose headers were not sent (SKIP)")
	default:
		if err := f.applyCommon(common, h, request); err != nil {
			return nil, err
		}
	}
	bm := common.GetBodyMutation()
	if bm == nil {
		return chunk, nil
	}
	if _, ok := bm.GetMutation().(*extprocv3.BodyMutation_StreamedResponse); ok && mode == streamed {
		// A FailedPrecondition (processor_state.cc, handleStreamedBodyCallback): spurious.
		return passOn(f.spurious(reply, "a body reply without streamed_response"))
	}
	// BUFFERED keeps the content-length of headers sent: a body mutation must match it
	// (processor_state.cc, validateContentLength, after this reply's header mutation),
	// comparing it with the mutation's body, empty for clear_body and streamed_response;
	// a missing or unparsable content-length (a chunked message) is not checked.
	if mode == buffered && headersHeld {
		if n, err := strconv.ParseUint(h.first("content-length"), 10, 64); err == nil && n != uint64(len(bm.GetBody())) {
			return nil, f.processorFailed(fmt.Errorf("%w: mismatch between content length and the length of the mutated body", errMutation))
		}
	}
	// MutationUtils::applyBodyMutations (mutation_utils.cc): body replaces, clear_body
	// empties, anything else leaves the body as it came.
	switch m := bm.GetMutation().(type) {
	case *extprocv3.BodyMutation_Body:
		return m.Body, nil
	case *extprocv3.BodyMutation_ClearBody:
		if m.ClearBody {
			return nil, nil
		}
	}
	return chunk, nil
}

// bodyMode is the body send mode of a direction.
func (f *flow) bodyMode(request bool) extprocfilterv3.ProcessingMode_BodySendMode {
	if request {
		return f.s.Config.ProcessingMode.GetRequestBodyMode()
	}
	return f.s.Config.ProcessingMode.GetResponseBodyMode()
}

// headersSent reports whether a direction's header mode sends its headers.
func (f *flow) headersSent(request bool) bool {
	if request {
		return f.s.Config.ProcessingMode.GetRequestHeaderMode() != skip
	}
	return f.s.Config.ProcessingMode.GetResponseHeaderMode() != skip
}

// removesContentLength is ProcessorState::shouldRemoveContentLength (processor_state.h):
// the body modes whose body may change without the headers knowing drop
// content-length, once the headers message has gone out (ext_proc.cc, decodeHeaders and
// encodeHeaders: the processor sees it), and skip a content-length the processor sets
// (mutation_utils.cc, remove_content_length).
func (f *flow) removesContentLength(request bool) bool {
	switch f.bodyMode(request) {
	case streamed, fullDuplex, partial:
		return true
	case buffered:
		return !f.headersSent(request)
	}
	return false
}

// dropContentLength drops h's content-length where the direction's body mode does,
// while the processor is in the picture (ext_proc.cc, decodeHeaders: not once
// processing is complete).
func (f *flow) dropContentLength(h headerMap, request bool) {
	if f.proc != nil && f.removesContentLength(request) {
		delete(h, "content-length")
	}
}

// requestFullDuplex sends the headers and every body chunk without waiting, then reads
// the headers reply (which may come only after the body) and the streamed body.
func (f *flow) requestFullDuplex(ctx context.Context, h headerMap, hasBody bool) ([]byte, error) {
	sendErr := make(chan error, 1)
	// Read here: the goroutine may outlive this call, and a clean close drops f.proc.
	md, proc := f.md, f.proc
	// The processor sees content-length; the request goes on without it (ext_proc.cc,
	// decodeHeaders).
	msg := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: h.proto(), EndOfStream: !hasBody}}, MetadataContext: md}
	f.dropContentLength(h, true)
	go func() {
		if err := proc.send(msg); err != nil || !hasBody {
			sendErr <- err
			return
		}
		sendErr <- f.sendChunks(proc, f.r.Body, md, true)
	}()
	reply, err := f.proc.recv(ctx, 0) // FULL_DUPLEX has no message timer
	if err != nil {
		return nil, f.processorFailed(err)
	}
	if ir, ok := reply.GetResponse().(*extprocv3.ProcessingResponse_ImmediateResponse); ok {
		f.immediate(reply, ir.ImmediateResponse)
		return nil, errLocalReply
	}
	r, ok := reply.GetResponse().(*extprocv3.ProcessingResponse_RequestHeaders)
	if !ok {
		return nil, f.spurious(reply, "request_headers")
	}
	f.keepMetadata(reply)
	if err := f.applyCommon(r.RequestHeaders.GetResponse(), h, true); err != nil {
		return nil, err
	}
	if !hasBody {
		return nil, <-sendErr
	}
	body, err := f.readStreamed(ctx, true, nil)
	if err != nil {
		return nil, err
	}
	return body, <-sendErr
}

// sendChunks streams a body to proc, one message per read, the last (possibly
// empty) with end_of_stream. If the body's source fails (the client or the upstream
// reset), the whole request is reset, as Envoy does: the processor's replies would
// otherwise be awaited forever. Each message carries md, the forwarded metadata, as
// every message Envoy sends does (ext_proc.cc, setupBodyChunk: addDynamicMetadata).
func (f *flow) sendChunks(proc *processor, r io.Reader, md *corev3.Metadata, request bool) error {
	buf := make([]byte, chunkSize)
	for {
		n, readErr := r.Read(buf)
		eos := errors.Is(readErr, io.EOF)
		if n > 0 || eos {
			msg := bodyMessage(&extprocv3.HttpBody{Body: bytes.Clone(buf[:n]), EndOfStream: eos}, request)
			msg.MetadataContext = md
			if err := proc.send(msg); err != nil {
				return err
			}
		}
		if eos {
			return nil
		}
		if readErr != nil {
			f.cancel()
			return readErr
		}
	}
}

// readStreamed collects FULL_DUPLEX streamed_response chunks until end_of_stream. A
// header mutation in these body replies is ignored (ENVOY.md §3). If out is set, each
// chunk is written to it as it arrives.
func (f *flow) readStreamed(ctx context.Context, request bool, out func([]byte)) ([]byte, error) {
	var body []byte
	for {
		reply, err := f.proc.recv(ctx, 0)
		if err != nil {
			return nil, f.processorFailed(err)
		}
		if ir, ok := reply.GetResponse().(*extprocv3.ProcessingResponse_ImmediateResponse); ok {
			f.immediate(reply, ir.ImmediateResponse) // resets the stream if the response started
			return nil, errLocalReply
		}
		common, ok := bodyReplyOf(reply, request)
		if !ok {
			return nil, f.spurious(reply, "streamed body")
		}
		f.ignoreMutation(common, "header mutation in a FULL_DUPLEX_STREAMED body reply")
		sr := common.GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			// "Normal body mutation response is received while body_mode_ is
			// FULL_DUPLEX_STREAMED" (processor_state.cc, handleStreamedBodyCallback): spurious.
			return nil, f.spurious(reply, "a FULL_DUPLEX_STREAMED body reply with streamed_response")
		}
		if out != nil {
			out(sr.GetBody())
		}
		body = append(body, sr.GetBody()...)
		if sr.GetEndOfStream() {
			return body, nil
		}
	}
}

// bodyMessage wraps a body chunk as the request- or response-direction message.
func bodyMessage(b *extprocv3.HttpBody, request bool) *extprocv3.ProcessingRequest {
	if request {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: b}}
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: b}}
}

// bodyReplyOf returns a body reply's CommonResponse; ok is false when the reply is not a
// body reply of the expected direction (a spurious message).
func bodyReplyOf(reply *extprocv3.ProcessingResponse, request bool) (*extprocv3.CommonResponse, bool) {
	switch r := reply.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_RequestBody:
		return r.RequestBody.GetResponse(), request
	case *extprocv3.ProcessingResponse_ResponseBody:
		return r.ResponseBody.GetResponse(), !request
	}
	return nil, false
}

// roundTrip sends msg and waits for its reply. A nil reply with a nil error means the
// processor is out of the picture and the request continues unmodified.
func (f *flow) roundTrip(ctx context.Context, msg *extprocv3.ProcessingRequest, timeout time.Duration) (*extprocv3.ProcessingResponse, error) {
	sent := time.Now()
	if err := f.proc.send(msg); err != nil {
		return nil, f.processorFailed(err)
	}
	reply, err := f.proc.recv(ctx, timeout)
	if err != nil {
		return nil, f.processorFailed(err)
	}
	if observe := f.s.Config.OnRoundTrip; observe != nil {
		observe(RoundTrip{Message: messageKind(msg), Took: time.Since(sent)})
	}
	if ir, ok := reply.GetResponse().(*extprocv3.ProcessingResponse_ImmediateResponse); ok {
		f.immediate(reply, ir.ImmediateResponse)
		return nil, errLocalReply
	}
	f.keepMetadata(reply)
	return reply, nil
}

// applyCommon applies a CommonResponse's header mutation and notes a route-cache clear,
// which takes effect only with a header mutation on the request side (ENVOY.md §3;
// processor_state.cc, DecodingProcessorState::clearRouteCache).
func (f *flow) applyCommon(c *extprocv3.CommonResponse, h headerMap, request bool) error {
	m := c.GetHeaderMutation()
	if m == nil {
		return nil
	}
	rules := mutationRules{allowEnvoy: f.s.Config.AllowEnvoyMutations, removeContentLength: f.removesContentLength(request)}
	f.mu.Lock()
	err := applyHeaderMutation(h, m, rules, &f.ex.IgnoredMutations)
	if err == nil && request && c.GetClearRouteCache() {
		f.ex.RouteCacheCleared = true
	}
	f.mu.Unlock()
	if err != nil {
		return f.processorFailed(err)
	}
	return nil
}

func (f *flow) keepMetadata(reply *extprocv3.ProcessingResponse) {
	f.mu.Lock()
	defer f.mu.Unlock()
	keepNamespaces(f.ex.DynamicMetadata, reply.GetDynamicMetadata(), f.s.Config.ReceivingNamespaces)
}

// ignoreMutation records a reply's header mutation that Envoy does not apply.
func (f *flow) ignoreMutation(c *extprocv3.CommonResponse, what string) {
	if c.GetHeaderMutation() != nil {
		f.ignore(what)
	}
}

func (f *flow) ignore(what string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ex.IgnoredMutations = append(f.ex.IgnoredMutations, what)
}

// spurious handles a reply of the wrong kind (ext_proc.cc, Filter::onReceiveMessage:
// "Spurious response message"): a processor failure.
func (f *flow) spurious(reply *extprocv3.ProcessingResponse, want string) error {
	return f.processorFailed(fmt.Errorf("spurious ext_proc reply %T while waiting for %s", reply.GetResponse(), want))
}

// processorFailed applies failure_mode_allow (ext_proc.cc, Filter::onGrpcError,
// onMessageTimeout and onReceiveMessage). A clean close by the processor always
// continues unmodified; a mutation Envoy rejects (errMutation) always ends with
// status_on_error, failing open or not (onReceiveMessage, handleErrorResponse); other
// failures continue unmodified when failing open, and otherwise end with a local reply:
// 504 on a message timeout, status_on_error (500) for the rest. It returns nil when the
// request should continue without the processor.
func (f *flow) processorFailed(err error) error {
	if errors.Is(err, errLocalReply) {
		return err
	}
	failOpen := f.s.Config.FailureModeAllow && f.bodyMode(true) != fullDuplex && !errors.Is(err, errMutation)
	if errors.Is(err, errClosed) || failOpen {
		f.proc = nil
		return nil
	}
	if errors.Is(err, errTimeout) {
		f.localReply(http.StatusGatewayTimeout, "ext_proc message timeout")
	} else {
		f.localReply(f.s.Config.StatusOnError, "ext_proc error: "+err.Error())
	}
	return errLocalReply
}

// immediate writes an ImmediateResponse as Envoy's local reply (ext_proc.cc,
// onReceiveMessage and sendImmediateResponse): the reply's dynamic metadata is kept; a
// status under 200 (or none) is 200 (isValidHttpStatus), as is one over 999, which Go
// cannot write; the headers go through the mutation rules, applied
// until one is rejected; the body as given. Once the response has started, a local
// reply can only reset the stream (filter_manager.cc, FilterManager::sendLocalReply:
// "Prior headers have already been sent"), and nothing of it reaches the client.
func (f *flow) immediate(reply *extprocv3.ProcessingResponse, ir *extprocv3.ImmediateResponse) {
	f.keepMetadata(reply)
	if f.wrote {
		panic(http.ErrAbortHandler)
	}
	status := int(ir.GetStatus().GetCode())
	if status < 200 || status > 999 {
		status = http.StatusOK
	}
	h := headerMap{}
	var ignored []string
	_ = applyHeaderMutation(h, ir.GetHeaders(), mutationRules{allowEnvoy: f.s.Config.AllowEnvoyMutations}, &ignored)
	for k, vs := range h {
		if strings.HasPrefix(k, ":") {
			continue
		}
		for _, v := range vs {
			f.w.Header().Add(k, v)
		}
	}
	f.w.WriteHeader(status)
	_, _ = f.w.Write(ir.GetBody())
	f.setStatus(status)
}

func (f *flow) localReply(status int, text string) {
	if f.wrote {
		panic(http.ErrAbortHandler) // the response has started: reset it
	}
	f.w.Header().Set("content-type", "text/plain")
	f.w.WriteHeader(status)
	_, _ = io.WriteString(f.w, text)
	f.setStatus(status)
}

func (f *flow) setStatus(status int) {
	f.wrote = true
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ex.Status = status
}

// upstreamAddress reads the destination as the ORIGINAL_DST cluster does with
// use_http_header (original_dst_cluster.cc, OriginalDstCluster::LoadBalancer::chooseHost):
// the first value of the header, which must parse as a literal ip:port; anything else
// (missing, a host name, a list) finds no host, and the router answers 503.
func upstreamAddress(h headerMap, name string) (string, bool) {
	ap, err := netip.ParseAddrPort(strings.TrimSpace(h.first(name)))
	if err != nil {
		return "", false
	}
	return ap.String(), true
}

// upstreamAddresses is upstreamAddress, or with fallbacks every ip:port of the header's
// comma-separated list, in order (entries that do not parse are skipped).
func upstreamAddresses(h headerMap, name string, fallbacks bool) ([]string, bool) {
	if !fallbacks {
		addr, ok := upstreamAddress(h, name)
		return []string{addr}, ok
	}
	var out []string
	for _, entry := range strings.Split(h.first(name), ",") {
		if ap, err := netip.ParseAddrPort(strings.TrimSpace(entry)); err == nil {
			out = append(out, ap.String())
		}
	}
	return out, len(out) > 0
}

// withServedEndpoint returns md with envoy.lb / x-gateway-destination-endpoint-served
// naming addr, as a GIE data plane reports the endpoint that served.
func withServedEndpoint(md *corev3.Metadata, addr string) *corev3.Metadata {
	out := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
	for ns, s := range md.GetFilterMetadata() {
		out.FilterMetadata[ns] = s
	}
	lb := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for k, v := range out.FilterMetadata["envoy.lb"].GetFields() {
		lb.Fields[k] = v
	}
	lb.Fields["x-gateway-destination-endpoint-served"] = structpb.NewStringValue(addr)
	out.FilterMetadata["envoy.lb"] = lb
	return out
}

func forwardedMetadata(route Route, namespaces []string) *corev3.Metadata {
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
	for _, ns := range namespaces {
		if v, ok := route.DynamicMetadata[ns]; ok {
			s, err := structpb.NewStruct(v)
			if err != nil {
				panic(fmt.Sprintf("envoytest: route metadata %q: %v", ns, err))
			}
			md.FilterMetadata[ns] = s
		}
	}
	if len(md.FilterMetadata) == 0 {
		return nil
	}
	return md
}
