package filter

import (
	"fmt"
	"net/textproto"
	"strings"
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

// Config configures the ext_proc [Server]. Its YAML keys sit at the top level of
// kvroute's config file.
type Config struct {
	// DestinationHeader is the request header that names the chosen worker's ip:port for
	// Envoy's ORIGINAL_DST cluster (original_dst_lb_config.http_header_name). It must not
	// start with x-envoy: ext_proc ignores mutations of those.
	DestinationHeader string `yaml:"destination_header" json:"destination_header"`
	// MaxBodyBytes caps the request body kvroute reads; a larger one gets a 413.
	MaxBodyBytes int `yaml:"max_body_bytes" json:"max_body_bytes"`
	// ChatPaths and CompletionsPaths are the routable paths (POST only; the query string
	// is ignored). Other requests are sent to the least-loaded worker.
	ChatPaths        []string `yaml:"chat_paths" json:"chat_paths"`
	CompletionsPaths []string `yaml:"completions_paths" json:"completions_paths"`
	// RequestBodyMode and ResponseBodyMode are the body modes of the Envoy filter config,
	// used when Envoy does not announce them (protocol_config, Envoy ≥ 1.34).
	RequestBodyMode  BodyMode `yaml:"request_body_mode" json:"request_body_mode"`
	ResponseBodyMode BodyMode `yaml:"response_body_mode" json:"response_body_mode"`
	// FallbackEndpoints appends up to this many next-best workers to the destination
	// (GIE's ordered list "ip:port,ip:port"). Only Envoy's override_host load balancing
	// policy reads a list; ORIGINAL_DST needs 0.
	FallbackEndpoints int `yaml:"fallback_endpoints" json:"fallback_endpoints"`
}

// DefaultConfig returns the defaults, which match examples/envoy.yaml.
func DefaultConfig() Config {
	return Config{
		DestinationHeader: "x-gateway-destination-endpoint",
		MaxBodyBytes:      4 << 20,
		ChatPaths:         []string{"/v1/chat/completions"},
		CompletionsPaths:  []string{"/v1/completions"},
		RequestBodyMode:   ModeBuffered,
		ResponseBodyMode:  ModeStreamed,
	}
}

// Validate reports the first invalid field, naming its YAML key.
func (c Config) Validate() error {
	h := strings.ToLower(c.DestinationHeader)
	switch {
	case h == "" || strings.ContainsAny(h, " :\t\r\n") || textproto.CanonicalMIMEHeaderKey(h) == "":
		return fmt.Errorf("destination_header: must be a header name, got %q", c.DestinationHeader)
	case strings.HasPrefix(h, "x-envoy"):
		return fmt.Errorf("destination_header: %q starts with x-envoy, which ext_proc may not set", c.DestinationHeader)
	case c.MaxBodyBytes <= 0:
		return fmt.Errorf("max_body_bytes: must be > 0, got %d", c.MaxBodyBytes)
	case len(c.ChatPaths)+len(c.CompletionsPaths) == 0:
		return fmt.Errorf("chat_paths: at least one routable path is needed")
	case c.FallbackEndpoints < 0:
		return fmt.Errorf("fallback_endpoints: must be ≥ 0, got %d", c.FallbackEndpoints)
	}
	for _, p := range append(append([]string{}, c.ChatPaths...), c.CompletionsPaths...) {
		if !strings.HasPrefix(p, "/") {
			return fmt.Errorf("chat_paths/completions_paths: %q must start with /", p)
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
