package session

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/fakeclock"
)

func newStore(t *testing.T, ttl time.Duration, max int) (*Store, *fakeclock.Clock) {
	t.Helper()
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	s, err := New(Config{Header: "x-session-id", TTL: ttl, MaxEntries: max}, clock.Now)
	require.NoError(t, err)
	return s, clock
}

func TestRemembersTheLastWorkerOfEachSession(t *testing.T) {
	s, _ := newStore(t, time.Minute, 10)
	_, ok := s.Lookup("a")
	assert.False(t, ok, "an unknown session has no worker")
	s.Remember("a", "w1")
	s.Remember("b", "w2")
	s.Remember("a", "w3")
	got, ok := s.Lookup("a")
	require.True(t, ok)
	assert.Equal(t, "w3", got, "the last worker wins")
	got, _ = s.Lookup("b")
	assert.Equal(t, "w2", got)
	assert.Equal(t, 2, s.Len())
}

func TestForgetsASessionIdleForTheTTL(t *testing.T) {
	s, clock := newStore(t, time.Minute, 10)
	s.Remember("a", "w1")
	clock.Advance(59 * time.Second)
	_, ok := s.Lookup("a")
	assert.True(t, ok, "within the TTL")
	s.Remember("a", "w1") // the session's next request refreshes it
	clock.Advance(59 * time.Second)
	_, ok = s.Lookup("a")
	assert.True(t, ok, "the TTL runs from the last request")
	clock.Advance(time.Second)
	_, ok = s.Lookup("a")
	assert.False(t, ok, "idle for the whole TTL")
	assert.Equal(t, 0, s.Len(), "and dropped")
}

func TestRememberDropsExpiredSessions(t *testing.T) {
	s, clock := newStore(t, time.Minute, 10)
	for i := range 5 {
		s.Remember(fmt.Sprint(i), "w")
	}
	clock.Advance(time.Minute)
	s.Remember("new", "w")
	assert.Equal(t, 1, s.Len(), "expired sessions go without a lookup")
}

func TestBoundedLeastRecentlyRememberedFirstOut(t *testing.T) {
	s, _ := newStore(t, time.Hour, 3)
	for _, id := range []string{"a", "b", "c"} {
		s.Remember(id, "w-"+id)
	}
	s.Remember("a", "w-a") // a is now the most recent
	s.Remember("d", "w-d") // evicts b, the least recent
	assert.Equal(t, 3, s.Len())
	for id, want := range map[string]bool{"a": true, "b": false, "c": true, "d": true} {
		_, ok := s.Lookup(id)
		assert.Equal(t, want, ok, id)
	}
}

func TestConcurrentUseIsSafe(t *testing.T) {
	s, _ := newStore(t, time.Hour, 50)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				id := fmt.Sprint(i % 80)
				s.Remember(id, fmt.Sprint("w", g))
				_, _ = s.Lookup(id)
			}
		})
	}
	wg.Wait()
	assert.LessOrEqual(t, s.Len(), 50)
}

func TestConfigValidateNamesTheKey(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"default is valid", func(*Config) {}, ""},
		{"empty header turns it off", func(c *Config) { c.Header = "" }, ""},
		{"header with a colon", func(c *Config) { c.Header = "x:y" }, "session.header"},
		{"header with a space", func(c *Config) { c.Header = "x session" }, "session.header"},
		{"zero ttl", func(c *Config) { c.TTL = 0 }, "session.ttl"},
		{"zero max_entries", func(c *Config) { c.MaxEntries = 0 }, "session.max_entries"},
		{"max_entries over the ceiling", func(c *Config) { c.MaxEntries = MaxEntriesCeiling + 1 }, "session.max_entries"},
		{"no agent headers", func(c *Config) { c.AgentHeaders = nil }, ""},
		{"an agent header that is no header name", func(c *Config) { c.AgentHeaders = []string{"x-a", "x b"} }, "session.agent_headers[1]"},
		{"an agent header that is session.header", func(c *Config) { c.AgentHeaders = []string{"X-Session-Id"} }, `session.agent_headers[0]: "X-Session-Id" is session.header`},
		{"an agent header listed twice", func(c *Config) { c.AgentHeaders = []string{"session-id", "Session-Id"} }, "session.agent_headers[1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.edit(&c)
			err := c.Validate()
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

func TestForgetWorkerForgetsTheSessionsItServedLast(t *testing.T) {
	s, _ := newStore(t, time.Hour, 10)
	s.Remember("a", "w1")
	s.Remember("b", "w2")
	s.Remember("c", "w1")
	s.Remember("a", "w2") // a's last worker is w2 now
	assert.Equal(t, 1, s.ForgetWorker("w1"))
	_, ok := s.Lookup("c")
	assert.False(t, ok, "c was last served by w1")
	for _, id := range []string{"a", "b"} {
		got, ok := s.Lookup(id)
		assert.True(t, ok, id)
		assert.Equal(t, "w2", got, id)
	}
	assert.Zero(t, s.ForgetWorker("w9"), "a worker no session names")
}

func TestMetricsReadTheStore(t *testing.T) {
	s, clock := newStore(t, time.Hour, 10)
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, s)
	s.Remember("a", "w")
	clock.Advance(time.Minute)
	s.Remember("b", "w")
	assert.Equal(t, 2.0, testutil.ToFloat64(m.entries))
	// With no request since, "a" is idle for the TTL: the gauge stops counting it (it
	// counted it until the next Remember).
	clock.Advance(time.Hour - time.Minute)
	assert.Equal(t, 1.0, testutil.ToFloat64(m.entries), "an expired session is not counted")
	assert.Equal(t, 1, s.Len())
	assert.Nil(t, NewMetrics(nil, s), "a nil registerer means no metrics")
}

// TestAStoreOfResponsesKeepsIdsUnderTheirOwnKeys: a store of responses keys ids with
// ResponseKey, so that what peers exchange of it cannot be named by a session header;
// its config's bounds name their own YAML keys.
func TestAStoreOfResponsesKeepsIdsUnderTheirOwnKeys(t *testing.T) {
	s, err := NewResponses(DefaultResponsesConfig(), nil)
	require.NoError(t, err)
	s.Remember("resp_1", "w0")
	assert.Equal(t, ResponseKey("resp_1"), s.KeyOf("resp_1"))
	worker, ok := s.Lookup("resp_1")
	assert.True(t, ok)
	assert.Equal(t, "w0", worker)
	s.RememberKey(Key("resp_2"), "w1") // a session's key for the same text
	_, ok = s.Lookup("resp_2")
	assert.False(t, ok, "a session's key names no response")

	for _, tt := range []struct {
		cfg  ResponsesConfig
		want string
	}{
		{ResponsesConfig{TTL: 0, MaxEntries: 1}, "responses.ttl"},
		{ResponsesConfig{TTL: time.Hour, MaxEntries: 0}, "responses.max_entries"},
	} {
		_, err := NewResponses(tt.cfg, nil)
		assert.ErrorContains(t, err, tt.want)
	}
}

// TestHeadersAreReadInOrderAndOffWithTheHeader: session.header comes first, then the
// agents' headers, lower case; an empty session.header turns every one off.
func TestHeadersAreReadInOrderAndOffWithTheHeader(t *testing.T) {
	c := DefaultConfig()
	assert.Equal(t, []string{"x-session-id", "x-claude-code-session-id", "x-session-affinity", "session-id", "session_id"}, c.Headers())
	c.Header, c.AgentHeaders = "X-Conversation", []string{"X-Agent-Session"}
	assert.Equal(t, []string{"x-conversation", "x-agent-session"}, c.Headers())
	c.Header = ""
	assert.Empty(t, c.Headers(), "off")
}
