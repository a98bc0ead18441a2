package kvevents

import (
	"fmt"
	"slices"
	"time"
)

// Config is the `kv_events` section of kvroute's config: how every worker's event
// stream is consumed. Where each worker publishes is its own `kv_events` key
// ([router.KVEvents]).
type Config struct {
	// SilenceTimeout puts an event-mode worker back in approximate mode when its stream
	// is broken (not connected) for this long, or silent: routed blocks it has not
	// reported for this long. An idle engine, sent nothing, is never silent. It returns
	// to event mode at its next event.
	SilenceTimeout time.Duration `yaml:"silence_timeout" json:"silence_timeout"`
	// ReplayTimeout bounds one replay request (the engine sends up to 10,000 batches);
	// a replay that fails or times out clears the worker's entries instead.
	ReplayTimeout time.Duration `yaml:"replay_timeout" json:"replay_timeout"`
	// ReconnectBackoffMax caps the back-off between attempts to reach an engine's
	// endpoint; it starts at 100 ms and doubles.
	ReconnectBackoffMax time.Duration `yaml:"reconnect_backoff_max" json:"reconnect_backoff_max"`
	// Tiers are the cache tiers whose blocks count in ov(w): device (GPU), host (CPU,
	// CPU_PINNED, CPU_TIER1), external (CPU_TIER2, DISK, NVME, others). A block on the
	// host must be copied back before it serves a prefix, so the default counts the
	// device only.
	Tiers []string `yaml:"tiers" json:"tiers"`
	// OffloadTiers are the tiers whose blocks are indexed apart, as offloaded: a run of
	// them continuing a worker's device overlap is priced by the policy's
	// offload_credit (a block loaded back costs a fraction of one recomputed). A tier is
	// in Tiers or here, not both. The default is the host: engines without CPU
	// offloading send no host events, so it changes nothing for them.
	OffloadTiers []string `yaml:"offload_tiers" json:"offload_tiers"`
	// OffloadBlockSize is the tokens in one offloaded block of engines that name their
	// host blocks by the device blocks' hashes alone and send block_size 0 (newer vLLM
	// with an offloaded block size k times the GPU's: kv_connector_extra_config
	// block_size); each such host block is then taken as k of kvroute's blocks. 0: as
	// the events say (0 there: one device block). A multiple of block_size.
	OffloadBlockSize int `yaml:"offload_block_size" json:"offload_block_size"`
	// MaxBindConnections caps the connections one bound endpoint (a worker's
	// `kv_events.bind`, per data-parallel rank) holds at once; more are closed on
	// arrival and counted (kvroute_kvevents_refused_connections_total). Each can hold a
	// message of up to 64 MiB, so the cap bounds the endpoint's memory: one engine rank
	// publishes on each endpoint, and the rest of the default leaves room for the
	// connections of engines that restarted, until their end is noticed.
	MaxBindConnections int `yaml:"max_bind_connections" json:"max_bind_connections"`
	// BindIdleDisplaceAfter lets a connection to a full bound endpoint take the place of
	// the one that has gone longest without delivering a message, if that is this long
	// or more (counted in kvroute_kvevents_displaced_connections_total); otherwise the
	// newcomer is refused. Before it, a client that shook hands and went quiet held
	// its place for good, and MaxBindConnections of them locked out a restarted engine.
	// The default, 30 s, is far above the gaps between a serving engine's batches (one
	// at every scheduler step that stores or removes blocks), so only idle, stale or
	// hostile connections go; and below the span of an engine's replay buffer (10,000
	// batches: 100 s at one per 10 ms step), so what an engine publishes while quiet
	// clients that came first keep it out is still replayed when it gets in. A
	// displaced engine reconnects by itself (a ZMQ connecting socket does), and its
	// next batch is checked against its replay as after any reconnection.
	BindIdleDisplaceAfter time.Duration `yaml:"bind_idle_displace_after" json:"bind_idle_displace_after"`
}

// maxBindConnections bounds kv_events.max_bind_connections.
const maxBindConnections = 1024

// minBindIdleDisplaceAfter bounds kv_events.bind_idle_displace_after from below: a
// shorter wait could displace an engine between two batches (one scheduler step of a
// long prefill, without chunking, can take seconds), and a bare number in the config
// ("30", read as 30 ns) is caught.
const minBindIdleDisplaceAfter = time.Second

// DefaultConfig returns the defaults: 10 s of silence, 5 s per replay, back-off up to
// 5 s, the device tier, 8 connections per bound endpoint, displaced after 30 s quiet.
func DefaultConfig() Config {
	return Config{SilenceTimeout: 10 * time.Second, ReplayTimeout: 5 * time.Second, ReconnectBackoffMax: 5 * time.Second,
		Tiers: []string{"device"}, OffloadTiers: []string{"host"}, MaxBindConnections: 8, BindIdleDisplaceAfter: 30 * time.Second}
}

// knownTier reports whether name is a tier's name in the config ([Tier.String]).
func knownTier(name string) bool { return name == "device" || name == "host" || name == "external" }

// Validate reports the first invalid field, naming its YAML path.
func (c Config) Validate() error {
	switch {
	case c.SilenceTimeout <= 0:
		return fmt.Errorf("kv_events.silence_timeout: must be > 0, got %s", c.SilenceTimeout)
	case c.ReplayTimeout <= 0:
		return fmt.Errorf("kv_events.replay_timeout: must be > 0, got %s", c.ReplayTimeout)
	case c.ReconnectBackoffMax < 100*time.Millisecond:
		return fmt.Errorf("kv_events.reconnect_backoff_max: must be ≥ 100ms, got %s", c.ReconnectBackoffMax)
	case len(c.Tiers) == 0:
		return fmt.Errorf("kv_events.tiers: must name at least one tier (device, host, external)")
	case c.OffloadBlockSize < 0 || c.OffloadBlockSize > maxBlockSize:
		return fmt.Errorf("kv_events.offload_block_size: must be from 0 (as the events say) to %d tokens, got %d", maxBlockSize, c.OffloadBlockSize)
	case c.MaxBindConnections < 1 || c.MaxBindConnections > maxBindConnections:
		return fmt.Errorf("kv_events.max_bind_connections: must be from 1 to %d, got %d", maxBindConnections, c.MaxBindConnections)
	case c.BindIdleDisplaceAfter < minBindIdleDisplaceAfter:
		return fmt.Errorf("kv_events.bind_idle_displace_after: must be ≥ %s, got %s", minBindIdleDisplaceAfter, c.BindIdleDisplaceAfter)
	}
	for i, t := range c.Tiers {
		if !knownTier(t) {
			return fmt.Errorf("kv_events.tiers[%d]: unknown tier %q (device, host, external)", i, t)
		}
	}
	for i, t := range c.OffloadTiers {
		switch {
		case !knownTier(t):
			return fmt.Errorf("kv_events.offload_tiers[%d]: unknown tier %q (device, host, external)", i, t)
		case slices.Contains(c.Tiers, t):
			return fmt.Errorf("kv_events.offload_tiers[%d]: %q is also in kv_events.tiers: a tier's blocks count as held or as offloaded, not both", i, t)
		}
	}
	return nil
}

// tierUse is what the index makes of a tier's blocks.
type tierUse uint8

const (
	tierIgnored   tierUse = iota // neither in Tiers nor in OffloadTiers
	tierHeld                     // in Tiers: they count in ov(w)
	tierOffloaded                // in OffloadTiers: indexed apart, priced by offload_credit
)

// String names the use in logs.
func (u tierUse) String() string {
	switch u {
	case tierHeld:
		return "held"
	case tierOffloaded:
		return "offloaded"
	}
	return "ignored"
}

// use reports what the index makes of blocks on tier t.
func (c Config) use(t Tier) tierUse {
	switch name := t.String(); {
	case slices.Contains(c.Tiers, name):
		return tierHeld
	case slices.Contains(c.OffloadTiers, name):
		return tierOffloaded
	}
	return tierIgnored
}
