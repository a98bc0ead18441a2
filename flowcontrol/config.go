package flowcontrol

import (
	"fmt"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/kvroute/kvroute/priority"
)

// Defaults. DefaultMaxWait is llm-d-router's defaultRequestTTL; the fairness headers are
// llm-d-router's and GIE's (metadata.FlowFairnessIDKey, OldFlowFairnessIDKey).
const (
	DefaultMaxWait        = 60 * time.Second
	DefaultMaxQueued      = 1024
	DefaultFairnessHeader = "x-llm-d-inference-fairness-id"
	LegacyFairnessHeader  = "x-gateway-inference-fairness-id"
)

// Bounds of the config and of what a request may name.
const (
	// MaxMaxWait bounds max_wait: a client waiting an hour for a first byte is gone.
	MaxMaxWait = time.Hour
	// MaxOverrideMessageTimeout bounds override_message_timeout: Envoy's bound on its
	// ext_proc filter's max_message_timeout (1h, ext_proc.proto), past which every
	// override would be ignored.
	MaxOverrideMessageTimeout = time.Hour
	// MaxMaxQueued bounds max_queued: each held request keeps its body (up to
	// max_body_bytes) and a goroutine.
	MaxMaxQueued = 1 << 20
	// MaxFairnessIDBytes bounds a fairness id (priority.MaxNameBytes): a longer header
	// value names none (the request joins the default flow), so a client cannot make
	// kvroute keep long keys.
	MaxFairnessIDBytes = priority.MaxNameBytes
)

// Config is the `flow_control` section of kvroute's config.
type Config struct {
	// Enabled holds requests no worker can take instead of refusing them at once.
	Enabled bool `yaml:"enabled" json:"enabled"`
	// MaxWait is the longest a request is held; then it gets the 429 it would have got
	// without flow control. Keep it under the clients' and the gateway's timeouts.
	MaxWait time.Duration `yaml:"max_wait" json:"max_wait"`
	// MaxQueued bounds the requests held at once, over every model; one more is refused
	// at once.
	MaxQueued int `yaml:"max_queued" json:"max_queued"`
	// HolderWait is how long a held request waits for the busy worker holding the most
	// of its prompt while another worker could take it; 0 never waits (the first worker
	// that frees takes it, and a session moves).
	HolderWait time.Duration `yaml:"holder_wait" json:"holder_wait"`
	// HoldOnSaturation holds requests of every priority while every candidate is
	// saturated (the priority section's thresholds on the engines' scraped queues and
	// KV use, and kvroute's bookings beyond a worker's max_num_seqs), as GIE's flow
	// control does, not only sheddable ones; a worker without a fresh reading counts as
	// not saturated. Without it a priority-0 request is held only at
	// max_active_requests_per_worker.
	HoldOnSaturation bool `yaml:"hold_on_saturation" json:"hold_on_saturation"`
	// OverrideMessageTimeout, when not 0, is the override_message_timeout kvroute sends
	// Envoy as it holds a request: Envoy restarts the body's message timer at it, so a
	// held request is not answered 504 after message_timeout. Envoy honours it only
	// with its filter's max_message_timeout at least as long, once per message, and
	// has no such timer in FULL_DUPLEX_STREAMED (none is sent then). Set it to max_wait
	// plus a second or more (kvroute warns below that); 0 sends none (message_timeout
	// must then exceed max_wait).
	OverrideMessageTimeout time.Duration `yaml:"override_message_timeout" json:"override_message_timeout"`
	// FairnessHeader is the request header naming the request's fairness id (its
	// tenant): the ids of one priority take turns. DefaultFairnessHeader or
	// LegacyFairnessHeader reads both, as llm-d-router does; "" puts every request in
	// one flow.
	FairnessHeader string `yaml:"fairness_header" json:"fairness_header"`
}

// DefaultConfig is off, with llm-d-router's 60 s wait and fairness header.
func DefaultConfig() Config {
	return Config{MaxWait: DefaultMaxWait, MaxQueued: DefaultMaxQueued, FairnessHeader: DefaultFairnessHeader}
}

// Validate reports the first invalid field, naming its YAML path.
func (c Config) Validate() error {
	switch h := strings.ToLower(c.FairnessHeader); {
	case c.MaxWait <= 0 || c.MaxWait > MaxMaxWait:
		return fmt.Errorf("flow_control.max_wait: must be in (0, %s], got %s", MaxMaxWait, c.MaxWait)
	case c.MaxQueued < 1 || c.MaxQueued > MaxMaxQueued:
		return fmt.Errorf("flow_control.max_queued: must be in [1, %d], got %d", MaxMaxQueued, c.MaxQueued)
	case c.HolderWait < 0 || c.HolderWait > c.MaxWait:
		return fmt.Errorf("flow_control.holder_wait: must be in [0, max_wait (%s)], got %s", c.MaxWait, c.HolderWait)
	case c.OverrideMessageTimeout != 0 && (c.OverrideMessageTimeout < time.Millisecond || c.OverrideMessageTimeout > MaxOverrideMessageTimeout):
		return fmt.Errorf("flow_control.override_message_timeout: must be 0 (none sent) or in [1ms, %s], got %s", MaxOverrideMessageTimeout, c.OverrideMessageTimeout)
	case h != "" && !httpguts.ValidHeaderFieldName(h):
		return fmt.Errorf("flow_control.fairness_header: must be a header name or empty (one flow), got %q", c.FairnessHeader)
	}
	return nil
}

// Headers are the request headers read for the fairness id, in order, in lower case:
// the default header or its alias reads both (the first present counts), another name
// that header alone; none when flow control is off or the header is "".
func (c Config) Headers() []string {
	if !c.Enabled {
		return nil
	}
	switch h := strings.ToLower(c.FairnessHeader); h {
	case "":
		return nil
	case DefaultFairnessHeader, LegacyFairnessHeader:
		return []string{DefaultFairnessHeader, LegacyFairnessHeader}
	default:
		return []string{h}
	}
}

// ValidFairnessID reports whether a header value can be a fairness id: the rule of an
// objective's name (priority.ValidName: 1 to 253 visible ASCII bytes), as llm-d-router
// reads both headers alike. Any other value names none.
func ValidFairnessID(id string) bool {
	return priority.ValidName(id) == nil
}
