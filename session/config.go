package session

import (
	"fmt"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
)

// MaxEntriesCeiling bounds max_entries: about 100 bytes per entry, so at most ~1 GiB.
const MaxEntriesCeiling = 10_000_000

// Config is the `session` section of kvroute's config.
type Config struct {
	// Header is the request header whose value names the session. Requests without it
	// have no session. Empty turns session affinity off (AgentHeaders are not read
	// either).
	Header string `yaml:"header" json:"header"`
	// AgentHeaders are the session headers coding agents send on their own, read in
	// order after Header when a request does not carry it: the first with a value names
	// the session. So an agent's turns share a session without any client config, as
	// llm-d-router's agent-identity plugin reads them. Empty: only Header is read.
	AgentHeaders []string `yaml:"agent_headers" json:"agent_headers"`
	// TTL is how long a session is remembered after its last request.
	TTL time.Duration `yaml:"ttl" json:"ttl"`
	// MaxEntries bounds the sessions remembered; past it the least recently seen go.
	MaxEntries int `yaml:"max_entries" json:"max_entries"`
}

// DefaultAgentHeaders are the session headers agents send by themselves: Claude
// Code's x-claude-code-session-id (Anthropic's LLM gateway docs), OpenCode's
// x-session-affinity, and Codex's session-id and, in older builds, session_id.
func DefaultAgentHeaders() []string {
	return []string{"x-claude-code-session-id", "x-session-affinity", "session-id", "session_id"}
}

// DefaultConfig returns the defaults: header x-session-id, then the agents' headers
// (DefaultAgentHeaders), 30 minutes, 65,536 sessions.
func DefaultConfig() Config {
	return Config{Header: "x-session-id", AgentHeaders: DefaultAgentHeaders(), TTL: 30 * time.Minute, MaxEntries: 1 << 16}
}

// Headers returns the session headers requests are read for, lower case, in the order
// they count: Header, then AgentHeaders; none when Header is empty (off).
func (c Config) Headers() []string {
	if c.Header == "" {
		return nil
	}
	out := []string{strings.ToLower(c.Header)}
	for _, h := range c.AgentHeaders {
		out = append(out, strings.ToLower(h))
	}
	return out
}

// Validate reports the first invalid field, naming its YAML path.
func (c Config) Validate() error {
	h := strings.ToLower(c.Header)
	switch {
	case h != "" && !httpguts.ValidHeaderFieldName(h):
		return fmt.Errorf("session.header: must be a header name or empty (off), got %q", c.Header)
	case c.TTL <= 0:
		return fmt.Errorf("session.ttl: must be > 0, got %s", c.TTL)
	case c.MaxEntries < 1 || c.MaxEntries > MaxEntriesCeiling:
		return fmt.Errorf("session.max_entries: must be in [1, %d], got %d", MaxEntriesCeiling, c.MaxEntries)
	}
	for i, a := range c.AgentHeaders {
		name := strings.ToLower(a)
		if !httpguts.ValidHeaderFieldName(name) {
			return fmt.Errorf("session.agent_headers[%d]: must be a header name, got %q", i, a)
		}
		if strings.EqualFold(a, c.Header) {
			return fmt.Errorf("session.agent_headers[%d]: %q is session.header", i, a)
		}
		for _, earlier := range c.AgentHeaders[:i] {
			if strings.EqualFold(a, earlier) {
				return fmt.Errorf("session.agent_headers[%d]: %q is listed twice", i, a)
			}
		}
	}
	return nil
}

// ResponsesConfig is the `responses` section of kvroute's config: the memory of which
// worker stored each Responses API response (filter.responses_paths), kept in a
// [Store] of its own.
type ResponsesConfig struct {
	// TTL is how long a response is remembered after the worker stored it. vLLM keeps
	// them until the engine restarts; a client that comes back later than this to a
	// response is routed by load, and its engine answers 404 unless it stored it.
	TTL time.Duration `yaml:"ttl" json:"ttl"`
	// MaxEntries bounds the responses remembered; past it the oldest go.
	MaxEntries int `yaml:"max_entries" json:"max_entries"`
}

// DefaultResponsesConfig returns the defaults: 6 hours, 131,072 responses (about 13 MB).
func DefaultResponsesConfig() ResponsesConfig {
	return ResponsesConfig{TTL: 6 * time.Hour, MaxEntries: 1 << 17}
}

// Validate reports the first invalid field, naming its YAML path.
func (c ResponsesConfig) Validate() error {
	switch {
	case c.TTL <= 0:
		return fmt.Errorf("responses.ttl: must be > 0, got %s", c.TTL)
	case c.MaxEntries < 1 || c.MaxEntries > MaxEntriesCeiling:
		return fmt.Errorf("responses.max_entries: must be in [1, %d], got %d", MaxEntriesCeiling, c.MaxEntries)
	}
	return nil
}

// NewResponses returns an empty store of which worker stored each response. now is the
// clock for TTLs; nil means time.Now.
func NewResponses(cfg ResponsesConfig, now func() time.Time) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s, err := New(Config{TTL: cfg.TTL, MaxEntries: cfg.MaxEntries}, now)
	if err == nil {
		s.key = ResponseKey
	}
	return s, err
}
