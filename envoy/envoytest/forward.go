package envoytest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// hopByHop headers are not forwarded by a proxy (RFC 9110 §7.6.1).
var hopByHop = map[string]bool{
	"connection": true, "keep-alive": true, "proxy-connection": true, "te": true,
	"transfer-encoding": true, "upgrade": true, "trailer": true,
}

// forward sends the processed request to the upstream the destination header names and
// runs the response through the processor back to the client. When no upstream can be
// had, the router answers with a local reply that goes through the processor too
// (routerReply).
func (f *flow) forward(ctx context.Context, h headerMap, body []byte) error {
	addrs, ok := upstreamAddresses(h, f.s.Config.DestinationHeader, f.s.Config.ServeFromFallbacks)
	if !ok {
		// router.cc, Filter::sendNoHealthyUpstreamResponse.
		return f.routerReply(ctx, http.StatusServiceUnavailable, "no healthy upstream")
	}
	upCtx, timedOut, stop := f.routeTimer(ctx)
	defer stop()
	var resp *http.Response
	var err error
	for _, addr := range addrs {
		f.mu.Lock()
		f.ex.Upstream = addr
		f.mu.Unlock()
		if resp, err = f.send(upCtx, addr, h, body); err == nil {
			if f.s.Config.ServeFromFallbacks {
				f.md = withServedEndpoint(f.md, addr)
			}
			break
		}
	}
	if err != nil {
		status, text := upstreamFailure(err, timedOut())
		return f.routerReply(ctx, status, text)
	}
	defer resp.Body.Close()
	err = f.responsePhase(ctx, resp)
	if err != nil && !errors.Is(err, errLocalReply) && !f.wrote {
		// The upstream failed after its headers but before the response started
		// downstream (a BUFFERED body being read): the router's reply goes straight to
		// the client, past the filters that hold the upstream's headers
		// (filter_manager.cc, DownstreamFilterManager::sendLocalReply:
		// sendDirectLocalReply).
		f.localReply(upstreamFailure(err, timedOut()))
		return errLocalReply
	}
	return err
}

// routeTimer applies the route's timeout (RouteAction.timeout), which Envoy starts once
// the request has been received in full (router.cc, Filter::onRequestComplete): the
// upstream request's context ends when it fires. Before response headers that is the
// router's 504; after, the response is reset (its body read fails). timedOut reports
// whether it fired; stop ends the timer.
func (f *flow) routeTimer(ctx context.Context) (upCtx context.Context, timedOut func() bool, stop func()) {
	d := f.s.route(f.r.URL.Path).Timeout
	if d <= 0 {
		return ctx, func() bool { return false }, func() {}
	}
	upCtx, cancel := context.WithCancel(ctx)
	var fired atomic.Bool
	t := time.AfterFunc(d, func() {
		fired.Store(true)
		cancel()
	})
	return upCtx, fired.Load, func() { t.Stop(); cancel() }
}

// upstreamFailure is the router's local reply to an upstream request that failed with
// err: the 504 once the route timeout fired (router.cc, Filter::onResponseTimeout and
// onUpstreamTimeoutAbort), else the 503 of a reset (the connection refused or closed;
// Filter::onUpstreamReset), "upstream connect error or disconnect/reset before headers.
// reset reason: ...", the reason as Http::Utility::resetReasonToString names it.
func upstreamFailure(err error, timedOut bool) (status int, text string) {
	if timedOut {
		return http.StatusGatewayTimeout, "upstream request timeout"
	}
	reason := "connection termination"
	if errors.Is(err, syscall.ECONNREFUSED) {
		reason = "remote connection failure, transport failure reason: delayed connect error: Connection refused"
	}
	return http.StatusServiceUnavailable, "upstream connect error or disconnect/reset before headers. reset reason: " + reason
}

// routerReply sends a local reply of the data plane itself (the router's 503 or 504, the
// 413 of a request body past the buffer limit) as Envoy does while the response has not
// started: through the encoder filter chain, every encoder filter included
// (filter_manager.cc, DownstreamFilterManager::sendLocalReply and
// sendLocalReplyViaFilterChain, which calls encodeHeaders(nullptr, ...): iteration starts
// at the first encoder filter). The ext_proc filter's encodeHeaders has no check for a
// local reply (ext_proc.cc, Filter::encodeHeaders: only processing_complete_ and the
// header mode), so the processor gets response_headers with the local reply's :status,
// content-type text/plain and content-length, then its body per the response body mode,
// like any upstream response (http/utility.cc, Utility::prepareLocalReply: a HEAD
// request's reply has no body). A processor already out of the picture (closed, failed
// open) sees nothing, nor, with Config.SkipLocalReplies, does any processor.
func (f *flow) routerReply(ctx context.Context, status int, text string) error {
	if f.wrote {
		panic(http.ErrAbortHandler) // the response has started: reset it
	}
	if f.s.Config.SkipLocalReplies {
		// ext_proc.h, Filter::onLocalReply: processing_complete_ = true.
		f.proc = nil
	}
	resp := &http.Response{StatusCode: status, Header: http.Header{}, Body: http.NoBody}
	if text != "" {
		resp.Header.Set("content-type", "text/plain")
		resp.Header.Set("content-length", strconv.Itoa(len(text)))
		if f.r.Method != http.MethodHead {
			resp.ContentLength = int64(len(text))
			resp.Body = io.NopCloser(strings.NewReader(text))
		}
	}
	f.mu.Lock()
	f.ex.LocalReply = true
	f.mu.Unlock()
	if err := f.responsePhase(ctx, resp); err != nil {
		return err
	}
	return errLocalReply
}

// send sends the processed request to addr.
func (f *flow) send(ctx context.Context, addr string, h headerMap, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, h.first(":method"), "http://"+addr+h.first(":path"), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, vs := range h {
		if strings.HasPrefix(k, ":") || hopByHop[k] || k == "host" || k == "content-length" {
			continue
		}
		req.Header[http.CanonicalHeaderKey(k)] = vs
	}
	req.Host = h.first(":authority")
	return f.s.upstream.Do(req)
}

func (f *flow) responsePhase(ctx context.Context, resp *http.Response) error {
	bodyMode := f.bodyMode(false)
	if f.proc == nil {
		bodyMode = none
	}
	h := fromHTTP(resp.Header)
	h[":status"] = []string{strconv.Itoa(resp.StatusCode)}
	hasBody := resp.ContentLength != 0

	if bodyMode == fullDuplex {
		return f.responseFullDuplex(ctx, h, resp.Body, hasBody)
	}
	if f.proc != nil && f.headersSent(false) {
		msg := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
			ResponseHeaders: &extprocv3.HttpHeaders{Headers: h.proto(), EndOfStream: !hasBody}}}
		if err := f.exchangeHeaders(ctx, msg, h, false); err != nil {
			return err
		}
	}
	f.dropContentLength(h, false)
	if bodyMode == none || f.proc == nil || !hasBody {
		// A response whose headers ended the stream has no body for the processor to see
		// in any mode (ENVOY.md §1: the headers message alone).
		f.writeHeaders(h)
		return f.copyBody(resp.Body, nil)
	}
	if bodyMode == partial {
		out, more, err := f.partialBody(ctx, h, resp.Body, resp.ContentLength, false)
		if err != nil {
			return err
		}
		f.writeHeaders(h)
		f.writeChunk(out)
		if !more {
			return nil
		}
		return f.copyBody(resp.Body, nil) // the rest goes on unseen
	}
	if bodyMode == buffered {
		// A response buffered past the buffer limit is Envoy's 500, its headers not yet
		// sent (filter_manager.cc, ActiveStreamEncoderFilter::responseDataTooLarge).
		body, err := io.ReadAll(io.LimitReader(resp.Body, int64(f.s.Config.BufferLimit)+1))
		if err != nil {
			return err
		}
		if len(body) > f.s.Config.BufferLimit {
			f.localReply(http.StatusInternalServerError, "Internal Server Error")
			return errLocalReply
		}
		out, err := f.exchangeBody(ctx, h, body, true, false)
		if err != nil {
			return err
		}
		f.writeHeaders(h)
		_, _ = f.w.Write(out)
		return nil
	}
	// STREAMED: one message and one reply per chunk, written to the client as it comes.
	f.writeHeaders(h)
	f.flush() // Envoy sends the headers on once their reply is in, before any body
	return f.copyBody(resp.Body, func(chunk []byte, eos bool) ([]byte, error) {
		return f.exchangeBody(ctx, h, chunk, eos, false)
	})
}

// responseFullDuplex streams the response through the processor: headers and chunks go
// out as they arrive, the headers reply comes first, then streamed_response chunks.
func (f *flow) responseFullDuplex(ctx context.Context, h headerMap, body io.Reader, hasBody bool) error {
	sendErr := make(chan error, 1)
	// Read here: a clean close drops f.proc while the goroutine may still be sending.
	md, proc := f.md, f.proc
	// The processor sees content-length; the response goes on without it (ext_proc.cc,
	// encodeHeaders).
	msg := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: h.proto(), EndOfStream: !hasBody}}, MetadataContext: md}
	f.dropContentLength(h, false)
	go func() {
		if err := proc.send(msg); err != nil || !hasBody {
			sendErr <- err
			return
		}
		sendErr <- f.sendChunks(proc, body, md, false)
	}()
	reply, err := f.proc.recv(ctx, 0)
	if err != nil {
		return f.processorFailed(err)
	}
	if ir, ok := reply.GetResponse().(*extprocv3.ProcessingResponse_ImmediateResponse); ok {
		f.immediate(reply, ir.ImmediateResponse)
		return errLocalReply
	}
	r, ok := reply.GetResponse().(*extprocv3.ProcessingResponse_ResponseHeaders)
	if !ok {
		return f.spurious(reply, "response_headers")
	}
	f.keepMetadata(reply)
	if err := f.applyCommon(r.ResponseHeaders.GetResponse(), h, false); err != nil {
		return err
	}
	f.writeHeaders(h)
	f.flush() // Envoy sends the headers on once their reply is in, before any body
	if hasBody {
		if _, err := f.readStreamed(ctx, false, f.writeChunk); err != nil {
			return err
		}
	}
	return <-sendErr
}

func (f *flow) writeHeaders(h headerMap) {
	status, err := strconv.Atoi(h.first(":status"))
	if err != nil || status < 100 {
		status = http.StatusBadGateway
	}
	for k, vs := range h {
		if strings.HasPrefix(k, ":") || hopByHop[k] {
			continue
		}
		f.w.Header()[http.CanonicalHeaderKey(k)] = vs
	}
	f.w.WriteHeader(status)
	f.setStatus(status)
}

func (f *flow) writeChunk(b []byte) {
	if len(b) == 0 {
		return
	}
	_, _ = f.w.Write(b)
	f.flush()
}

func (f *flow) flush() {
	if fl, ok := f.w.(http.Flusher); ok {
		fl.Flush()
	}
}

// copyBody streams the upstream body to the client, passing each chunk (and a final
// empty end-of-stream chunk) through process when it is set.
func (f *flow) copyBody(r io.Reader, process func(chunk []byte, eos bool) ([]byte, error)) error {
	buf := make([]byte, chunkSize)
	for {
		n, readErr := r.Read(buf)
		eos := errors.Is(readErr, io.EOF)
		if readErr != nil && !eos {
			// Upstream reset mid-body: Envoy resets the client's stream (a clean end
			// here would pass a truncated response off as complete).
			panic(http.ErrAbortHandler)
		}
		chunk := bytes.Clone(buf[:n])
		if process != nil && (n > 0 || eos) {
			out, err := process(chunk, eos)
			if err != nil {
				if errors.Is(err, errLocalReply) {
					panic(http.ErrAbortHandler) // headers already sent: reset the stream
				}
				return err
			}
			chunk = out
		}
		f.writeChunk(chunk)
		if eos {
			return nil
		}
	}
}
