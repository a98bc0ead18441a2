package filter

import (
	"fmt"
	"net/textproto"
	"slices"
	"strings"

	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/rewrite"
)

// BodyMode names an ext_proc body send mode, as in Envoy's ProcessingMode.
type BodyMode string

// The body modes kvroute handles.
const (
	ModeNone       BodyMode = "NONE"
	ModeStreamed   BodyMode = "STREAMED"
	ModeBuffered   BodyMode = "BUFFERED"
	ModeFullDuplex BodyMode = "FULL_DUPLEX_STREAMED"
)

// Ceilings of the body limits: a config above them is refused rather than trusted.
const (
	// MaxBodyBytesCeiling bounds max_body_bytes: a buffered body travels as one gRPC
	// message, held whole in memory per stream.
	MaxBodyBytesCeiling = 64 << 20
	// MaxJSONDepthCeiling bounds max_json_depth, and so the parser's recursion.
	MaxJSONDepthCeiling = 10_000
)

// limits are the body parser's limits from the config.
func (c Config) limits() openai.Limits {
	return openai.Limits{MaxDepth: c.MaxJSONDepth, MaxPromptTokens: c.MaxPromptTokens}
}

// Config configures the ext_proc [Server]. Its YAML keys sit at the top level of
// kvroute's config file.
type Config struct {
	// DestinationHeader is the request header that names the chosen worker's ip:port for
	// Envoy's ORIGINAL_DST cluster (original_dst_lb_config.http_header_name). It must not
	// start with x-envoy: ext_proc ignores mutations of those.
	DestinationHeader string `yaml:"destination_header" json:"destination_header"`
	// MaxBodyBytes caps the request body kvroute reads; a larger one gets a 413. At most
	// MaxBodyBytesCeiling: the gRPC server's receive limit is derived from it.
	MaxBodyBytes int `yaml:"max_body_bytes" json:"max_body_bytes"`
	// MaxConcurrentBodyBytes bounds the bytes of the request bodies kvroute parses,
	// renders and encodes at once (each may take several times its size while it is);
	// a body that would pass it is routed by load on its model alone (never refused).
	// 0 means no bound; otherwise at least MaxBodyBytes, so any one body fits.
	MaxConcurrentBodyBytes int64 `yaml:"max_concurrent_body_bytes" json:"max_concurrent_body_bytes"`
	// MaxJSONDepth is the deepest nesting of arrays and objects a body may have; deeper
	// bodies get a 400 naming the limit.
	MaxJSONDepth int `yaml:"max_json_depth" json:"max_json_depth"`
	// MaxPromptTokens caps a completions prompt given as token ids; longer ones get a 400.
	MaxPromptTokens int `yaml:"max_prompt_tokens" json:"max_prompt_tokens"`
	// ChatPaths and CompletionsPaths are the routable paths (POST only; the query string
	// is ignored). Other requests are sent to the least-loaded worker.
	ChatPaths        []string `yaml:"chat_paths" json:"chat_paths"`
	CompletionsPaths []string `yaml:"completions_paths" json:"completions_paths"`
	// ResponsesPaths are the paths of OpenAI's Responses API (POST creates a response;
	// <path>/<id> and what follows it name a stored one). vLLM keeps responses in each
	// engine's memory: a POST naming previous_response_id, and any request for
	// <path>/<id>, go to the worker that stored that response when kvroute saw it
	// stored (the `responses` section); others are routed by load. Empty: every such
	// request is routed by load, its body unread.
	ResponsesPaths []string `yaml:"responses_paths" json:"responses_paths"`
	// MessagesPaths are the paths of Anthropic's Messages API (POST), which vLLM serves
	// by converting the body to a chat completion: kvroute routes such a body on that
	// chat, as a chat completion's (openai.MessagesChat), and answers its own errors
	// there and under <path>/ (count_tokens) in Anthropic's error shape, which
	// Anthropic's clients read. Empty: every such request is routed by load, its body
	// unread.
	MessagesPaths []string `yaml:"messages_paths" json:"messages_paths"`
	// GeneratePaths are the paths of vLLM's token-in/token-out API (POST
	// /inference/v1/generate): the body's token_ids are the prompt, routed on as a
	// completions prompt of token ids is. A body naming no model is routed on the model
	// header's model, or by load without one. Empty: such requests are routed by load,
	// their bodies unread.
	GeneratePaths []string `yaml:"generate_paths" json:"generate_paths"`
	// SGLangGeneratePaths are the paths of SGLang's native generate API (POST
	// /generate): the body's input_ids, or its text encoded as a completions prompt, is
	// the prompt. Its body names no model: it is routed for the model header's model,
	// else DefaultModel, else by load. A body whose prompt kvroute does not compute is
	// routed by load, never refused (the engine judges it). Empty: such requests are
	// routed by load, their bodies unread.
	SGLangGeneratePaths []string `yaml:"sglang_generate_paths" json:"sglang_generate_paths"`
	// SGLangOpenSessionPaths are the paths of SGLang's POST (or GET) /open_session:
	// routed by load, their successful answer read for the id of the session the engine
	// opened, so that the session's turns (an SGLangGeneratePaths body naming it in
	// session_params.id) and its SGLangCloseSessionPaths request go to that engine,
	// which alone holds it. Empty: kvroute does not learn where sessions live.
	SGLangOpenSessionPaths []string `yaml:"sglang_open_session_paths" json:"sglang_open_session_paths"`
	// SGLangCloseSessionPaths are the paths of SGLang's POST /close_session: the body's
	// session_id is read, and the request sent to the engine that opened the session.
	// Empty: such requests are routed by load, their bodies unread.
	SGLangCloseSessionPaths []string `yaml:"sglang_close_session_paths" json:"sglang_close_session_paths"`
	// DefaultModel is the model of a body that names none (SGLang's /generate; vLLM's
	// generate API without model) when the model header gives none: such a body is
	// routed on its prompt for this model, run by the engine on its base model. Empty:
	// such bodies are routed by load over every worker.
	DefaultModel string `yaml:"default_model" json:"default_model"`
	// RequestBodyMode and ResponseBodyMode are the body modes of the Envoy filter config,
	// used when Envoy does not announce them (protocol_config, Envoy ≥ 1.34).
	RequestBodyMode  BodyMode `yaml:"request_body_mode" json:"request_body_mode"`
	ResponseBodyMode BodyMode `yaml:"response_body_mode" json:"response_body_mode"`
	// ModelHeader names the request header that tells load-only routing (requests whose
	// body kvroute does not read) the model, so that only workers serving it are
	// candidates. GIE's body-based router sets x-gateway-model-name from the body. When
	// the header is absent (or this is ""), every worker is a candidate: routed by load
	// alone, whatever the model.
	ModelHeader string `yaml:"model_header" json:"model_header"`
	// FallbackEndpoints appends up to this many next-best workers to the destination
	// (GIE's ordered list "ip:port,ip:port"). Only Envoy's override_host load balancing
	// policy reads a list; ORIGINAL_DST needs 0.
	FallbackEndpoints int `yaml:"fallback_endpoints" json:"fallback_endpoints"`
	// PrefillHeader is the request header that names a disaggregated request's prefill
	// worker (ip:port) for the decode worker's routing sidecar (llm-d's
	// x-prefiller-host-port). kvroute sets it when it splits a request and removes any
	// client-sent value otherwise: the sidecar sends the prompt wherever it names.
	PrefillHeader string `yaml:"prefill_header" json:"prefill_header"`
}

// DefaultConfig returns the defaults, which match examples/envoy.yaml.
func DefaultConfig() Config {
	return Config{
		DestinationHeader: "x-gateway-destination-endpoint",
		ModelHeader:       "x-gateway-model-name",
		PrefillHeader:     "x-prefiller-host-port",
		MaxBodyBytes:      4 << 20,
		// 16 bodies of the largest size, hundreds of usual ones: measured live, 32
		// concurrent 4 MiB bodies took kvroute to 1 GiB (docs/BENCHMARKS.md).
		MaxConcurrentBodyBytes:  64 << 20,
		MaxJSONDepth:            openai.DefaultLimits().MaxDepth,
		MaxPromptTokens:         openai.DefaultLimits().MaxPromptTokens,
		ChatPaths:               []string{"/v1/chat/completions"},
		CompletionsPaths:        []string{"/v1/completions"},
		ResponsesPaths:          []string{"/v1/responses"},
		MessagesPaths:           []string{"/v1/messages"},
		GeneratePaths:           []string{"/inference/v1/generate"},
		SGLangGeneratePaths:     []string{"/generate"},
		SGLangOpenSessionPaths:  []string{"/open_session"},
		SGLangCloseSessionPaths: []string{"/close_session"},
		RequestBodyMode:         ModeBuffered,
		ResponseBodyMode:        ModeStreamed,
	}
}

// Validate reports the first invalid field, naming its YAML key.
func (c Config) Validate() error {
	h := strings.ToLower(c.DestinationHeader)
	switch {
	case !isHeaderName(h):
		return fmt.Errorf("destination_header: must be a header name, got %q", c.DestinationHeader)
	case c.ModelHeader != "" && !isHeaderName(strings.ToLower(c.ModelHeader)):
		return fmt.Errorf("model_header: must be a header name or empty, got %q", c.ModelHeader)
	case strings.EqualFold(c.ModelHeader, c.DestinationHeader):
		return fmt.Errorf("model_header: must differ from destination_header (%q)", c.DestinationHeader)
	case strings.HasPrefix(h, "x-envoy"):
		return fmt.Errorf("destination_header: %q starts with x-envoy, which ext_proc may not set", c.DestinationHeader)
	case !isHeaderName(strings.ToLower(c.PrefillHeader)):
		return fmt.Errorf("prefill_header: must be a header name, got %q", c.PrefillHeader)
	case strings.HasPrefix(strings.ToLower(c.PrefillHeader), "x-envoy"):
		return fmt.Errorf("prefill_header: %q starts with x-envoy, which ext_proc may not set", c.PrefillHeader)
	case strings.EqualFold(c.PrefillHeader, c.DestinationHeader) || strings.EqualFold(c.PrefillHeader, c.ModelHeader):
		return fmt.Errorf("prefill_header: must differ from destination_header and model_header, got %q", c.PrefillHeader)
	case reservedHeaders[strings.ToLower(c.PrefillHeader)]:
		return fmt.Errorf("prefill_header: %q is a header the request needs or Envoy owns (kvroute removes prefill_header from every request it does not split)", c.PrefillHeader)
	case c.MaxBodyBytes <= 0 || c.MaxBodyBytes > MaxBodyBytesCeiling:
		return fmt.Errorf("max_body_bytes: must be in [1, %d] (64 MiB), got %d", MaxBodyBytesCeiling, c.MaxBodyBytes)
	case c.MaxConcurrentBodyBytes != 0 && c.MaxConcurrentBodyBytes < int64(c.MaxBodyBytes):
		return fmt.Errorf("max_concurrent_body_bytes: must be 0 (no bound) or at least max_body_bytes (%d), got %d", c.MaxBodyBytes, c.MaxConcurrentBodyBytes)
	case c.MaxJSONDepth < 1 || c.MaxJSONDepth > MaxJSONDepthCeiling:
		return fmt.Errorf("max_json_depth: must be in [1, %d], got %d", MaxJSONDepthCeiling, c.MaxJSONDepth)
	case c.MaxPromptTokens < 1:
		return fmt.Errorf("max_prompt_tokens: must be > 0, got %d", c.MaxPromptTokens)
	case len(c.ChatPaths)+len(c.CompletionsPaths) == 0:
		return fmt.Errorf("chat_paths: at least one routable path is needed")
	case c.FallbackEndpoints < 0:
		return fmt.Errorf("fallback_endpoints: must be ≥ 0, got %d", c.FallbackEndpoints)
	}
	if c.DefaultModel != "" {
		if err := rewrite.ValidModel(c.DefaultModel); err != nil {
			return fmt.Errorf("default_model: %v", err)
		}
	}
	seen := map[string]bool{}
	const pathKeys = "chat_paths/completions_paths/responses_paths/messages_paths/generate_paths/sglang_generate_paths/sglang_open_session_paths/sglang_close_session_paths"
	for _, p := range slices.Concat(c.ChatPaths, c.CompletionsPaths, c.ResponsesPaths, c.MessagesPaths, c.GeneratePaths, c.SGLangGeneratePaths, c.SGLangOpenSessionPaths, c.SGLangCloseSessionPaths) {
		switch {
		case !strings.HasPrefix(p, "/"):
			return fmt.Errorf("%s: %q must start with /", pathKeys, p)
		case seen[p]:
			return fmt.Errorf("%s: %q is listed twice", pathKeys, p)
		case strings.ContainsAny(p, "?#"):
			return fmt.Errorf("%s: %q must be a path alone (the query string is ignored)", pathKeys, p)
		}
		seen[p] = true
	}
	for _, p := range c.ResponsesPaths {
		if p == "/" || strings.HasSuffix(p, "/") {
			return fmt.Errorf("responses_paths: %q must not end with / (its stored responses are <path>/<id>)", p)
		}
	}
	for _, p := range c.MessagesPaths {
		if p == "/" || strings.HasSuffix(p, "/") {
			return fmt.Errorf("messages_paths: %q must not end with / (<path>/count_tokens is its own)", p)
		}
	}
	switch c.RequestBodyMode {
	case ModeBuffered, ModeFullDuplex:
	default:
		return fmt.Errorf("request_body_mode: must be BUFFERED or FULL_DUPLEX_STREAMED, got %q", c.RequestBodyMode)
	}
	switch c.ResponseBodyMode {
	case ModeNone, ModeStreamed, ModeBuffered, ModeFullDuplex:
	default:
		return fmt.Errorf("response_body_mode: must be NONE, STREAMED, BUFFERED or FULL_DUPLEX_STREAMED, got %q", c.ResponseBodyMode)
	}
	return nil
}

// reservedHeaders are request headers prefill_header may not name: kvroute removes it
// from every request it does not split and overwrites it on the rest, which would strip
// a request's framing, host, credentials or tracing, or is refused by Envoy's default
// header mutation rules (host) and silently ignored.
var reservedHeaders = map[string]bool{
	"host": true, "content-length": true, "content-type": true, "content-encoding": true,
	"transfer-encoding": true, "connection": true, "keep-alive": true, "proxy-connection": true,
	"te": true, "trailer": true, "upgrade": true, "expect": true, "authorization": true,
	"cookie": true, "x-request-id": true, "x-forwarded-for": true, "x-forwarded-proto": true,
	"x-forwarded-host": true, "traceparent": true, "tracestate": true,
}

func isHeaderName(h string) bool {
	return h != "" && !strings.ContainsAny(h, " :\t\r\n") && textproto.CanonicalMIMEHeaderKey(h) != ""
}
