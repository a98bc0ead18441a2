package index

import (
	"fmt"
	"time"
)

// Config configures an [Index]. Its YAML form is the `index` section of kvroute's config.
type Config struct {
	// CapacityBlocks is each worker's cache capacity in blocks unless the worker sets its
	// own: in approximate mode the oldest records past it are forgotten, as the engine's
	// LRU would evict them. It should match the engine's num_gpu_blocks.
	CapacityBlocks int `yaml:"capacity_blocks" json:"capacity_blocks"`
	// TTL forgets a block this long after it was last stored on a worker; 0 keeps blocks
	// until capacity evicts them. In approximate mode it covers what the router cannot
	// see: engine evictions caused by traffic from elsewhere.
	TTL time.Duration `yaml:"ttl" json:"ttl"`
	// PendingTTL is how long, on a worker whose engine reports KV events, a routing
	// decision's blocks count as held before the engine's events confirm them (an
	// [EventIndex]'s pending blocks). It covers the engine's delay between receiving a
	// request and reporting the blocks it computed: a queue wait plus a prefill.
	PendingTTL time.Duration `yaml:"pending_ttl" json:"pending_ttl"`
}

// DefaultConfig returns the defaults: vLLM's 16,384-block example capacity, a
// two-minute TTL and a two-second pending TTL.
func DefaultConfig() Config {
	return Config{CapacityBlocks: 16384, TTL: 2 * time.Minute, PendingTTL: DefaultPendingTTL}
}

// DefaultPendingTTL is the default [Config.PendingTTL]: a few passes of a busy engine,
// enough for a queued prompt to be computed and reported (measured by replay).
const DefaultPendingTTL = 2 * time.Second

// Validate reports the first invalid field, naming its YAML path.
func (c Config) Validate() error {
	if err := c.validateIndex(); err != nil {
		return err
	}
	if c.PendingTTL <= 0 {
		return fmt.Errorf("index.pending_ttl: must be > 0, got %s", c.PendingTTL)
	}
	return nil
}

// validateIndex checks the fields a plain [Index] reads.
func (c Config) validateIndex() error {
	if c.CapacityBlocks <= 0 {
		return fmt.Errorf("index.capacity_blocks: must be > 0, got %d", c.CapacityBlocks)
	}
	if c.TTL < 0 {
		return fmt.Errorf("index.ttl: must be ≥ 0, got %s", c.TTL)
	}
	return nil
}
