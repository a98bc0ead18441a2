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
}

// DefaultConfig returns the defaults: vLLM's 16,384-block example capacity and a
// two-minute TTL.
func DefaultConfig() Config {
	return Config{CapacityBlocks: 16384, TTL: 2 * time.Minute}
}

// Validate reports the first invalid field, naming its YAML path.
func (c Config) Validate() error {
	if c.CapacityBlocks <= 0 {
		return fmt.Errorf("index.capacity_blocks: must be > 0, got %d", c.CapacityBlocks)
	}
	if c.TTL < 0 {
		return fmt.Errorf("index.ttl: must be ≥ 0, got %s", c.TTL)
	}
	return nil
}
