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
	// have no session. Empty turns session affinity off.
	Header string `yaml:"header" json:"header"`
	// TTL is how long a session is remembered after its last request.
	TTL time.Duration `yaml:"ttl" json:"ttl"`
	// MaxEntries bounds the sessions remembered; past it the least recently seen go.
	MaxEntries int `yaml:"max_entries" json:"max_entries"`
}

// DefaultConfig returns the defaults: header x-session-id, 30 minutes, 65,536 sessions.
func DefaultConfig() Config {
	return Config{Header: "x-session-id", TTL: 30 * time.Minute, MaxEntries: 1 << 16}
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
	return nil
}
