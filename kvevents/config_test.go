package kvevents

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestConfigNamesTheFieldItRefuses(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want string // "" for valid
	}{
		{"the defaults", func(*Config) {}, ""},
		{"host counted as held, nothing offloaded", func(c *Config) { c.Tiers, c.OffloadTiers = []string{"device", "host"}, nil }, ""},
		{"host and external offloaded", func(c *Config) { c.OffloadTiers = []string{"host", "external"} }, ""},
		{"no held tier", func(c *Config) { c.Tiers = nil }, "kv_events.tiers: must name at least one tier"},
		{"unknown held tier", func(c *Config) { c.Tiers = []string{"device", "gpu"} }, `kv_events.tiers[1]: unknown tier "gpu"`},
		{"unknown offload tier", func(c *Config) { c.OffloadTiers = []string{"cpu"} }, `kv_events.offload_tiers[0]: unknown tier "cpu"`},
		{"a tier both held and offloaded", func(c *Config) { c.Tiers = []string{"device", "host"} }, `kv_events.offload_tiers[0]: "host" is also in kv_events.tiers`},
		{"no silence timeout", func(c *Config) { c.SilenceTimeout = 0 }, "kv_events.silence_timeout"},
		{"a back-off too short", func(c *Config) { c.ReconnectBackoffMax = time.Millisecond }, "kv_events.reconnect_backoff_max"},
		{"an offloaded block size", func(c *Config) { c.OffloadBlockSize = 64 }, ""},
		{"a negative offloaded block size", func(c *Config) { c.OffloadBlockSize = -16 }, "kv_events.offload_block_size: must be from 0"},
		{"one connection per bound endpoint", func(c *Config) { c.MaxBindConnections = 1 }, ""},
		{"no connection per bound endpoint", func(c *Config) { c.MaxBindConnections = 0 }, "kv_events.max_bind_connections: must be from 1 to 1024, got 0"},
		{"too many connections per bound endpoint", func(c *Config) { c.MaxBindConnections = 1025 }, "kv_events.max_bind_connections: must be from 1 to 1024, got 1025"},
		{"bound connections displaced after a second quiet", func(c *Config) { c.BindIdleDisplaceAfter = time.Second }, ""},
		{"bound connections displaced after less", func(c *Config) { c.BindIdleDisplaceAfter = time.Second - 1 }, "kv_events.bind_idle_displace_after: must be ≥ 1s, got 999.999999ms"},
		{"a bare number of seconds, read as nanoseconds", func(c *Config) { c.BindIdleDisplaceAfter = 30 }, "kv_events.bind_idle_displace_after: must be ≥ 1s, got 30ns"},
		{"no displacement wait", func(c *Config) { c.BindIdleDisplaceAfter = 0 }, "kv_events.bind_idle_displace_after: must be ≥ 1s, got 0s"},
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

func TestEachTierIsHeldOffloadedOrIgnored(t *testing.T) {
	c := DefaultConfig()
	assert.Equal(t, tierHeld, c.use(TierOf("GPU")))
	assert.Equal(t, tierHeld, c.use(TierOf("")))
	for _, medium := range []string{"CPU", "CPU_PINNED", "CPU_TIER1"} {
		assert.Equal(t, tierOffloaded, c.use(TierOf(medium)), medium)
	}
	for _, medium := range []string{"CPU_TIER2", "DISK", "NVME"} {
		assert.Equal(t, tierIgnored, c.use(TierOf(medium)), medium)
	}
}
