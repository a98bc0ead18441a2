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
	// OffloadCapacityBlocks bounds, per worker, the blocks an [EventIndex] keeps of what
	// the engine reported in its offload tiers (kv_events.offload_tiers: host memory):
	// the engine's own BlockRemoved events keep it true, this keeps its memory bounded.
	// 0 (the default) is DefaultOffloadFactor times the worker's capacity.
	OffloadCapacityBlocks int `yaml:"offload_capacity_blocks" json:"offload_capacity_blocks"`
	// ApproximateOffload says the engines of workers without KV events (approximate
	// mode) write their KV cache through to host memory (vLLM's CPU offloading,
	// LMCache): the blocks of routing decisions that such a worker's capacity evicts
	// are then kept as offloaded (up to OffloadCapacityBlocks) rather than forgotten,
	// and earn the policy's offload_credit as an engine's reported host blocks do. A
	// worker whose KV events start has its guesses dropped for what it reports.
	ApproximateOffload bool `yaml:"approximate_offload" json:"approximate_offload"`
}

// DefaultOffloadFactor sizes a worker's offloaded blocks when offload_capacity_blocks
// is 0: host memory is typically several times the GPU's KV cache (vLLM's CPU
// offloading and LMCache are sized in GiB of RAM per GPU).
const DefaultOffloadFactor = 4

// OffloadCapacity returns the offloaded blocks kept for a worker of the given device
// capacity in blocks.
func (c Config) OffloadCapacity(capacityBlocks int) int {
	if c.OffloadCapacityBlocks > 0 {
		return c.OffloadCapacityBlocks
	}
	return DefaultOffloadFactor * capacityBlocks
}

// DefaultConfig returns the defaults: vLLM's 16,384-block example capacity, a
// ten-minute TTL and a two-second pending TTL.
//
// The TTL was two minutes (Dynamo's approximate-mode TTL) until 2026-12-05. Replay
// (docs/BENCHMARKS.md, "The approximate index's TTL"): the capacity already evicts
// what a busy engine evicts, so two minutes only forgot prefixes idle engines still
// held: 8 points of hit share on the Mooncake synthetic trace at trace speed, and 2.6×
// the recompute of sessions pausing 30-210 s. Ten minutes gave the capacity-only
// results on every workload measured, and the least recompute with two replicas whose
// approximate indexes do not see each other's traffic (where a TTL bounds staleness).
func DefaultConfig() Config {
	return Config{CapacityBlocks: 16384, TTL: DefaultTTL, PendingTTL: DefaultPendingTTL}
}

// DefaultTTL is the default [Config.TTL].
const DefaultTTL = 10 * time.Minute

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
	if c.OffloadCapacityBlocks < 0 {
		return fmt.Errorf("index.offload_capacity_blocks: must be ≥ 0 (0: %d× the worker's capacity), got %d", DefaultOffloadFactor, c.OffloadCapacityBlocks)
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
