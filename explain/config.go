package explain

import (
	"fmt"
	"math"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// MaxBuffer bounds explain.buffer. A sampled entry keeps at most 8 destination and 8
// prefill candidates: about 7 KiB with 8 and 8 and no adapters, and at most about
// 24 KiB with each candidate's adapter names at MaxEngineAdapterBytes (measured
// 2026-12-06), so the ring stays under ~100 MiB whatever the config. (It was 65,536
// until then, with a comment that counted 2 KiB an entry: 420 MiB to 9 GiB.)
const MaxBuffer = 4096

// Config is the `explain` section of kvroute's config.
type Config struct {
	// Enabled answers a request that carries Header with a truthy value ("1", "true")
	// with its decision in the ResponseHeader. Off, the request header is ignored (and
	// still never forwarded upstream).
	Enabled bool `yaml:"enabled" json:"enabled"`
	// Header is the request header that asks for the decision.
	Header string `yaml:"header" json:"header"`
	// SampleRate is the share of decisions, in [0, 1], kept for GET /decisions on the
	// admin port; 0 keeps none. It applies whether or not Enabled is set: the admin port
	// is the operator's, not the clients'.
	SampleRate float64 `yaml:"sample_rate" json:"sample_rate"`
	// Buffer is how many sampled decisions are kept, newest first out last.
	Buffer int `yaml:"buffer" json:"buffer"`
}

// DefaultConfig returns the defaults: answers off, header x-kvroute-explain, 1 % of
// decisions kept in a ring of 256.
func DefaultConfig() Config {
	return Config{Header: "x-kvroute-explain", SampleRate: 0.01, Buffer: 256}
}

// Validate reports the first invalid field, naming its YAML path.
func (c Config) Validate() error {
	h := strings.ToLower(c.Header)
	switch {
	case h == "" || !httpguts.ValidHeaderFieldName(h):
		return fmt.Errorf("explain.header: must be a header name, got %q", c.Header)
	case strings.HasPrefix(h, "x-envoy"):
		return fmt.Errorf("explain.header: %q starts with x-envoy, which ext_proc may not remove", c.Header)
	case math.IsNaN(c.SampleRate) || c.SampleRate < 0 || c.SampleRate > 1:
		return fmt.Errorf("explain.sample_rate: must be in [0, 1], got %v", c.SampleRate)
	case c.Buffer < 1 || c.Buffer > MaxBuffer:
		return fmt.Errorf("explain.buffer: must be in [1, %d], got %d", MaxBuffer, c.Buffer)
	}
	return nil
}
