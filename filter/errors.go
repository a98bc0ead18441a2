package filter

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/kvroute/kvroute/flowcontrol"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/router"
)

// Errors the edge maps to HTTP statuses (see statusOf).
var (
	// ErrBadRequest marks a client error: malformed JSON or a missing or ill-typed field.
	ErrBadRequest = errors.New("bad request")
	// ErrBodyTooLarge marks a request body over max_body_bytes.
	ErrBodyTooLarge = errors.New("request body too large")
	// ErrBadOverride marks a per-route policy override from the gateway's config that
	// does not validate: an operator error, reported as a server error.
	ErrBadOverride = errors.New("invalid route policy override")
	// errNoRequestHeaders marks a request body or trailers that came before the request
	// headers: the Envoy filter skips them (request_header_mode SKIP), so kvroute can
	// neither route the request nor remove a client-sent destination. An operator error,
	// reported as a server error.
	errNoRequestHeaders = errors.New("ext_proc sent no request headers: the filter's processing_mode.request_header_mode must be SEND")
)

// badRequest is a client error the filter itself finds (not the body parser's).
func badRequest(format string, args ...any) error {
	return &openai.FieldError{Msg: fmt.Sprintf(format, args...)}
}

// apiError is an error as the OpenAI API reports it.
type apiError struct {
	status  int
	message string
	kind    string // "type" of the OpenAI error object
	param   string
	code    string
	// retryAfter, when set, is sent as the retry-after header (seconds).
	retryAfter string
	// anthropic: the request is for Anthropic's Messages API, whose clients read
	// Anthropic's error shape (anthropicBody), not OpenAI's.
	anthropic bool
}

// toAPIError maps an error from parsing or routing to the client-facing error.
func toAPIError(err error) apiError {
	var fe *openai.FieldError
	switch {
	case errors.As(err, &fe):
		return apiError{status: http.StatusBadRequest, message: fe.Msg, kind: "invalid_request_error", param: fe.Param, code: "invalid_request"}
	case errors.Is(err, ErrBodyTooLarge):
		return apiError{status: http.StatusRequestEntityTooLarge, message: err.Error(), kind: "invalid_request_error", param: "", code: "request_too_large"}
	case errors.Is(err, ErrBadRequest), errors.Is(err, openai.ErrBadRequest), errors.Is(err, router.ErrBadRequest):
		return apiError{status: http.StatusBadRequest, message: err.Error(), kind: "invalid_request_error", param: "", code: "invalid_request"}
	case errors.Is(err, router.ErrModelNotFound):
		return apiError{status: http.StatusNotFound, message: err.Error(), kind: "invalid_request_error", param: "model", code: "model_not_found"}
	case errors.Is(err, flowcontrol.ErrTimedOut):
		// The 429 the router's refusal would have got at once, after max_wait held.
		return rateLimited("no inference worker could take this request while it was queued; retry shortly")
	case errors.Is(err, flowcontrol.ErrShuttingDown):
		// A held request at the start of a drain: answered now, it can go to another
		// replica (Envoy's retry policy, the client's retry of a 503).
		return apiError{status: http.StatusServiceUnavailable, message: "this router is shutting down; retry",
			kind: "server_error", code: "shutting_down", retryAfter: "1"}
	case errors.Is(err, flowcontrol.ErrQueueFull):
		return rateLimited("every inference worker is busy and the queue is full; retry shortly")
	case errors.Is(err, router.ErrOverloaded):
		return rateLimited("every inference worker is at its request limit; retry shortly")
	case errors.Is(err, router.ErrSaturated):
		// The same 429 as the active-request limit's: GIE's endpoint picker answers a shed
		// sheddable request with a 429 too, and clients retry it alike.
		return rateLimited("the inference pool is saturated and this request's objective is sheddable (priority below 0); retry shortly")
	case errors.Is(err, router.ErrOnlyPrefillWorkers):
		return apiError{status: http.StatusServiceUnavailable, message: "only prefill workers serve this model; a request needs a decode worker (workers[].role)",
			kind: "server_error", param: "model", code: "no_decode_worker"}
	case errors.Is(err, router.ErrNoWorkers):
		return apiError{status: http.StatusServiceUnavailable, message: "no inference worker is available for this request", kind: "server_error", param: "", code: "no_workers_available"}
	case errors.Is(err, errNoRequestHeaders):
		return apiError{status: http.StatusInternalServerError, message: err.Error(), kind: "server_error", param: "", code: "invalid_gateway_config"}
	case errors.Is(err, ErrBadOverride):
		return apiError{status: http.StatusInternalServerError, message: err.Error(), kind: "server_error", param: "", code: "invalid_route_policy"}
	default:
		return apiError{status: http.StatusInternalServerError, message: "internal routing error", kind: "server_error", param: "", code: "internal_error"}
	}
}

// rateLimited is OpenAI's own 429 (type requests, code rate_limit_exceeded) with a
// retry-after of a second: every refusal for capacity gets it, so that clients' retry
// logic applies alike.
func rateLimited(message string) apiError {
	return apiError{status: http.StatusTooManyRequests, message: message, kind: "requests", code: "rate_limit_exceeded", retryAfter: "1"}
}

// body renders the error JSON: OpenAI's {"error":{"message","type","param","code"}},
// or Anthropic's for a Messages API request (anthropicBody).
func (e apiError) body() []byte {
	if e.anthropic {
		return e.anthropicBody()
	}
	var param, code any
	if e.param != "" {
		param = e.param
	}
	if e.code != "" {
		code = e.code
	}
	out, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": e.message, "type": e.kind, "param": param, "code": code,
	}})
	return out
}

// anthropicBody renders the error as Anthropic's API does, and vLLM's /v1/messages
// (AnthropicErrorResponse): {"type":"error","error":{"type","message"}}. Anthropic's
// clients choose what to do by the status (retrying 429 after retry-after, and 5xx);
// the type is Anthropic's name for the status.
func (e apiError) anthropicBody() []byte {
	out, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]any{
		"type": anthropicErrorType(e.status), "message": e.message,
	}})
	return out
}

// anthropicErrorType is Anthropic's error type for an HTTP status
// (docs.anthropic.com, "Errors").
func anthropicErrorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "invalid_request_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	default:
		return "api_error"
	}
}
