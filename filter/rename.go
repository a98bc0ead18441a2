package filter

import (
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvroute/kvroute/openai"
)

// A rewritten request's response names the target model in its top-level "model"
// (every chunk of a stream does), or in an Anthropic Messages stream in its
// message_start event's "message" object: kvroute gives it back the client's, as GIE's
// endpoint picker does since its #2769 (openai.ModelRenamer). Requests that were not
// rewritten take none of this path.

// rename is a request's model rewrite: the client asked for requested, the engine got
// target.
type rename struct {
	requested, target string
	body              *openai.ModelRenamer // set by startRename
}

// startRename reads a rewritten request's response headers: the rename goes on with a
// renamer for the body, or ends (st.rename nil) where the body cannot or need not be
// renamed.
func (st *stream) startRename(h *extprocv3.HttpHeaders) {
	if !h.GetEndOfStream() {
		st.rename.body = st.responseRenamer(h.GetHeaders())
	}
	if st.rename.body == nil {
		st.rename = nil
	}
}

// renaming reports whether the response body is renamed: the request was rewritten,
// and the response headers said the body can be (startRename). Without them (a data
// plane whose response_header_mode is SKIP sends the body alone) nothing says what the
// body is: it passes as it came.
func (st *stream) renaming() bool {
	if st.rename != nil && st.rename.body == nil {
		st.rename = nil
	}
	return st.rename != nil
}

// responseRenamer returns the renamer for a rewritten request's response body, given
// its headers, or nil where the body cannot be renamed: body mode NONE (kvroute never
// sees it) or BUFFERED_PARTIAL (the rest of a body past Envoy's buffer goes on unseen,
// under the content-length it came with); a compressed body (content-encoding other
// than identity); a body that is neither JSON nor an event stream.
func (st *stream) responseRenamer(h *corev3.HeaderMap) *openai.ModelRenamer {
	switch {
	case st.respMode == ModeNone, st.respMode == ModeBuffered && st.respPartial:
		return nil
	}
	if enc := strings.TrimSpace(headerValue(h, "content-encoding")); enc != "" && !strings.EqualFold(enc, "identity") {
		return nil
	}
	mediaType, _, _ := strings.Cut(headerValue(h, headerContentType), ";")
	mediaType = strings.ToLower(strings.TrimSpace(mediaType))
	switch {
	case mediaType == "text/event-stream":
		return openai.NewModelRenamer(st.rename.target, st.rename.requested, true)
	case mediaType == "application/json", strings.HasPrefix(mediaType, "application/") && strings.HasSuffix(mediaType, "+json"):
		return openai.NewModelRenamer(st.rename.target, st.rename.requested, false)
	}
	return nil
}

// renamedBody answers a response body chunk with its model renamed, as each mode lets
// a reply change the body (ENVOY.md §2, §3):
//   - STREAMED: each chunk's reply replaces it (or passes it when nothing changed); a
//     model value cut by the chunk's end is held back and goes out with the next one.
//     Envoy has dropped content-length.
//   - FULL_DUPLEX_STREAMED: the streamed_response chunks carry the body as renamed; a
//     chunk wholly held back gets no reply until the rest of the value comes.
//   - BUFFERED: the whole body comes in one message (without end_of_stream when
//     trailers follow), replaced with a content-length to match in the same reply.
//
// The usage object is read from the body as the engine sent it (keepTail), renamed or
// not.
func (st *stream) renamedBody(chunk []byte, endOfStream bool) []*extprocv3.ProcessingResponse {
	final := endOfStream || st.respMode == ModeBuffered
	out, changed := st.rename.body.Rename(chunk, final)
	switch st.respMode {
	case ModeFullDuplex:
		if len(out) == 0 && !endOfStream {
			return nil
		}
		return streamedReplies(out, endOfStream, false)
	case ModeBuffered:
		if !changed {
			return st.one(st.bodyAck())
		}
		return st.one(replacedResponseBodyReply(out, true))
	default:
		if !changed {
			return st.one(st.bodyAck())
		}
		return st.one(replacedResponseBodyReply(out, false))
	}
}

// renameRest returns what the renamer still holds when the response's trailers end its
// body: in FULL_DUPLEX_STREAMED, one more streamed chunk before the trailers reply. A
// STREAMED reply to trailers cannot carry body bytes: there, only a body cut inside its
// model value (no engine's) would lose the cut value's start.
func (st *stream) renameRest() []*extprocv3.ProcessingResponse {
	out, _ := st.rename.body.Rename(nil, true)
	if len(out) == 0 || st.respMode != ModeFullDuplex {
		return nil
	}
	return streamedReplies(out, false, false)
}
