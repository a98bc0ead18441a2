package filter

import (
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// headersReply continues the request, applying mutation (if any) and, with it, asking
// Envoy to re-pick the route: clear_route_cache only acts alongside a header mutation.
func headersReply(mutation *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: commonResponse(mutation)},
	}}
}

// bodyReply answers a request body message (BUFFERED or STREAMED), optionally with a
// header mutation, which only BUFFERED applies.
func bodyReply(mutation *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
		RequestBody: &extprocv3.BodyResponse{Response: commonResponse(mutation)},
	}}
}

// replacedBodyReply is bodyReply that also replaces the request's BUFFERED body with
// body. BUFFERED keeps the request's content-length, so the same reply sets it to the
// new body's length (ENVOY.md §3): Envoy forwards the header and the body as they are.
func replacedBodyReply(mutation *extprocv3.HeaderMutation, body []byte) *extprocv3.ProcessingResponse {
	mutation.SetHeaders = append(mutation.SetHeaders, contentLength(body))
	r := bodyReply(mutation)
	r.GetRequestBody().Response.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: body}}
	return r
}

// replacedResponseBodyReply replaces a STREAMED response chunk, or with buffered the
// whole BUFFERED response body, with body. BUFFERED keeps the response's
// content-length, so the same reply sets it to body's length (ENVOY.md §3); STREAMED has
// dropped it.
func replacedResponseBodyReply(body []byte, buffered bool) *extprocv3.ProcessingResponse {
	common := &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: body}}}
	if len(body) == 0 {
		common.BodyMutation.Mutation = &extprocv3.BodyMutation_ClearBody{ClearBody: true}
	}
	if buffered {
		common.HeaderMutation = &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{contentLength(body)}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: common}}}
}

// contentLength sets content-length to body's length: a BUFFERED body replaced keeps
// the header Envoy had, which must match (ENVOY.md §3).
func contentLength(body []byte) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: "content-length", RawValue: strconv.AppendInt(nil, int64(len(body)), 10)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

func commonResponse(mutation *extprocv3.HeaderMutation) *extprocv3.CommonResponse {
	return &extprocv3.CommonResponse{HeaderMutation: mutation, ClearRouteCache: mutation != nil}
}

// streamedReplies returns body (request direction if request, else response) to Envoy
// in FULL_DUPLEX_STREAMED chunks of at most maxStreamedChunk bytes; the last carries
// endOfStream. An empty body still yields one (empty) chunk.
func streamedReplies(body []byte, endOfStream, request bool) []*extprocv3.ProcessingResponse {
	var out []*extprocv3.ProcessingResponse
	for first := true; first || len(body) > 0; first = false {
		n := min(len(body), maxStreamedChunk)
		chunk := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
			BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
				StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body[:n], EndOfStream: endOfStream && n == len(body)},
			}},
		}}
		body = body[n:]
		if request {
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: chunk}})
		} else {
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: chunk}})
		}
	}
	return out
}

// immediateReply ends the request with an OpenAI error as Envoy's local reply.
func immediateReply(e apiError) *extprocv3.ProcessingResponse {
	headers := []*corev3.HeaderValueOption{{
		Header: &corev3.HeaderValue{Key: headerContentType, RawValue: []byte("application/json")},
	}}
	if e.retryAfter != "" {
		headers = append(headers, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "retry-after", RawValue: []byte(e.retryAfter)}})
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(e.status)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: headers},
			Body:    e.body(),
			Details: "kvroute_" + e.code,
		},
	}}
}

// lbMetadataStruct is the GIE endpoint-picker metadata: envoy.lb/x-gateway-destination-endpoint.
func lbMetadataStruct(value string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		lbNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			destinationMDKey: structpb.NewStringValue(value),
		}}),
	}}
}

// headerValue returns the first value of a header (Envoy fills raw_value; value is read
// for senders that use it).
func headerValue(h *corev3.HeaderMap, name string) string {
	v, _ := lookupHeader(h, name)
	return v
}

// firstHeader reads the first of names the request carries: the value of its last
// entry, and the name; "", "" when it carries none. A header sent several times is read
// as GIE's endpoint picker reads it, each entry replacing the one before
// (handlers/request.go, HandleRequestHeaders); a header and its deprecated aliases as
// llm-d-router reads them (metadata.GetLowerCaseHeaderValue): a header present with an
// empty or unusable value is the one read, its aliases are not.
func firstHeader(h *corev3.HeaderMap, names []string) (value, name string) {
	headers := h.GetHeaders()
	for _, name := range names {
		for i := len(headers) - 1; i >= 0; i-- {
			if headers[i].GetKey() == name {
				return entryValue(headers[i]), name
			}
		}
	}
	return "", ""
}

// lookupHeader is headerValue that also reports whether the header is present.
func lookupHeader(h *corev3.HeaderMap, name string) (string, bool) {
	for _, hv := range h.GetHeaders() {
		if hv.GetKey() == name {
			return entryValue(hv), true
		}
	}
	return "", false
}

// entryValue is one header entry's value: Envoy fills raw_value; value is read for
// senders that use it.
func entryValue(hv *corev3.HeaderValue) string {
	if len(hv.GetRawValue()) > 0 {
		return string(hv.GetRawValue())
	}
	return hv.GetValue()
}
