package kvevents

import (
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Outcomes of an event, the outcome label of kvroute_kvevents_events_total.
const (
	outcomeApplied        = "applied"
	outcomeUnknownParent  = "unknown_parent" // BlockStored whose parent is not known
	outcomeUnknownBlock   = "unknown_block"  // an offload store by hash alone of blocks the device never reported
	outcomeOtherTier      = "other_tier"     // a medium whose tier does not count
	outcomeNotIndexable   = "not_indexable"  // a sliding-window, Mamba, … cache group
	outcomeBlockSize      = "block_size"     // block_size differs from kvroute's
	outcomeMalformed      = "malformed"      // a field of the wrong shape or length
	outcomeUnattributable = "unattributable" // no model to salt with, or a LoRA id without name
	outcomeUnknownType    = "unknown_type"   // an event type this version does not know
	outcomeRankOutOfRange = "rank_out_of_range"
)

// Reasons a worker's event state was reset, the reason label of
// kvroute_kvevents_resets_total.
const (
	reasonGap       = "gap"       // a sequence gap no replay could fill
	reasonRestart   = "restart"   // the publisher's sequence restarted
	reasonCleared   = "cleared"   // AllBlocksCleared
	reasonOverflow  = "overflow"  // the engine-hash map reached its bound
	reasonDecode    = "decode"    // a batch that could not be decoded
	reasonSilence   = "silence"   // the stream was silent or broken: approximate mode
	reasonMalformed = "malformed" // a removal that could not be read
	reasonGroups    = "groups"    // blocks in more than maxGroups cache groups of one rank and tier
	reasonPanic     = "panic"     // handling a message panicked: the batch may be half applied
)

// Metrics are the KV events consumer's Prometheus series. A nil *Metrics records
// nothing.
type Metrics struct {
	events         *prometheus.CounterVec
	unknownParents *prometheus.CounterVec
	gaps           *prometheus.CounterVec
	replays        *prometheus.CounterVec
	resets         *prometheus.CounterVec
	pruned         *prometheus.CounterVec
	decodeErrors   *prometheus.CounterVec
	refusedConns   *prometheus.CounterVec
	displacedConns *prometheus.CounterVec
	lag            prometheus.Histogram
}

// NewMetrics registers the consumer's counters on reg (nil: no metrics). The per-worker
// gauges (indexed blocks, mode) are registered by [New] from the Manager's state.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	if reg == nil {
		return nil
	}
	f := promauto.With(reg)
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return f.NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute", Subsystem: "kvevents", Name: name, Help: help}, labels)
	}
	return &Metrics{
		events:         counter("events_total", "KV events received, by type (BlockStored, BlockRemoved, AllBlocksCleared, unknown) and outcome (applied, or why not).", "type", "outcome"),
		unknownParents: counter("unknown_parents_total", "BlockStored events whose parent block the consumer does not know (skipped).", "worker"),
		gaps:           counter("gaps_total", "Sequence gaps: batches the consumer never received.", "worker"),
		replays:        counter("replays_total", "Replay requests to a worker's replay endpoint, by result (ok, partial: the engine no longer had the gap, failed).", "worker", "result"),
		resets:         counter("resets_total", "Times a worker's event entries were cleared, by reason (gap, restart, cleared, overflow, decode, silence, malformed, groups).", "worker", "reason"),
		pruned:         counter("offload_pruned_total", "Engine hashes of a worker's offload tiers forgotten when their map reached its bound, because the index's own LRU had evicted their blocks (engines that never remove, such as in-process LMCache). Steady growth means index.offload_capacity_blocks is smaller than the engines' host memory.", "worker"),
		decodeErrors:   counter("decode_errors_total", "Messages that were not KV events: bad frames, undecodable payloads (or over a batch's bounds), oversized messages, replayed batches numbered too far past the live stream.", "worker"),
		refusedConns:   counter("refused_connections_total", "Connections to a worker's bound endpoint (kv_events bind) closed on arrival because it held kv_events.max_bind_connections already.", "worker"),
		displacedConns: counter("displaced_connections_total", "Connections to a worker's bound endpoint (kv_events bind) closed to take a new one when it held kv_events.max_bind_connections: each the one quiet longest, quiet for kv_events.bind_idle_displace_after or more.", "worker"),
		lag: f.NewHistogram(prometheus.HistogramOpts{Namespace: "kvroute", Subsystem: "kvevents", Name: "lag_seconds",
			Help:    "From a batch's engine timestamp to its application to the index (includes clock skew between hosts).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}),
	}
}

// forget drops a removed worker's series, so pods coming and going do not pile up
// label sets for good (a worker added again under the name starts from zero, which
// Prometheus reads as a counter reset).
func (m *Metrics) forget(worker string) {
	if m == nil {
		return
	}
	for _, vec := range []*prometheus.CounterVec{m.unknownParents, m.gaps, m.replays, m.resets, m.pruned, m.decodeErrors, m.refusedConns, m.displacedConns} {
		vec.DeletePartialMatch(prometheus.Labels{"worker": worker})
	}
}

func (m *Metrics) event(t Type, outcome string) {
	if m != nil {
		m.events.WithLabelValues(t.String(), outcome).Inc()
	}
}

// eventN counts n events of one type and outcome.
func (m *Metrics) eventN(t Type, outcome string, n int) {
	if m != nil && n > 0 {
		m.events.WithLabelValues(t.String(), outcome).Add(float64(n))
	}
}

func (m *Metrics) unknownParent(worker string) {
	if m != nil {
		m.unknownParents.WithLabelValues(worker).Inc()
	}
}

func (m *Metrics) gap(worker string) {
	if m != nil {
		m.gaps.WithLabelValues(worker).Inc()
	}
}

func (m *Metrics) replay(worker, result string) {
	if m != nil {
		m.replays.WithLabelValues(worker, result).Inc()
	}
}

func (m *Metrics) reset(worker, reason string) {
	if m != nil {
		m.resets.WithLabelValues(worker, reason).Inc()
	}
}

func (m *Metrics) prune(worker string, n int) {
	if m != nil && n > 0 {
		m.pruned.WithLabelValues(worker).Add(float64(n))
	}
}

func (m *Metrics) decodeError(worker string) {
	if m != nil {
		m.decodeErrors.WithLabelValues(worker).Inc()
	}
}

func (m *Metrics) refusedConn(worker string) {
	if m != nil {
		m.refusedConns.WithLabelValues(worker).Inc()
	}
}

func (m *Metrics) displacedConn(worker string) {
	if m != nil {
		m.displacedConns.WithLabelValues(worker).Inc()
	}
}

// observeLag records now − ts; engine clocks ahead of ours count as 0, and timestamps
// that are not finite positive Unix times are not observed.
func (m *Metrics) observeLag(ts float64, now time.Time) {
	if m == nil || !(ts > 0) || math.IsInf(ts, 0) {
		return
	}
	lag := float64(now.UnixNano())/1e9 - ts
	m.lag.Observe(max(lag, 0))
}

// workerCollector exports each subscribed worker's indexed blocks and mode, read from
// the Manager at scrape time.
type workerCollector struct {
	m         *Manager
	blocks    *prometheus.Desc
	offloaded *prometheus.Desc
	mode      *prometheus.Desc
}

func newWorkerCollector(m *Manager) *workerCollector {
	return &workerCollector{m: m,
		blocks:    prometheus.NewDesc("kvroute_kvevents_indexed_blocks", "Blocks a worker's engine reported that the index holds (its confirmed entries).", []string{"worker"}, nil),
		offloaded: prometheus.NewDesc("kvroute_kvevents_offloaded_blocks", "Blocks a worker's engine reported in its offload tiers (kv_events.offload_tiers: host memory) that the index holds.", []string{"worker"}, nil),
		mode: prometheus.NewDesc("kvroute_kvevents_worker_mode", "1 for the mode a KV-event worker's index entries come from now: events, or approximate while its stream is silent or broken.",
			[]string{"worker", "mode"}, nil),
	}
}

func (c *workerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.blocks
	ch <- c.offloaded
	ch <- c.mode
}

func (c *workerCollector) Collect(ch chan<- prometheus.Metric) {
	for _, w := range c.m.snapshot() {
		ch <- prometheus.MustNewConstMetric(c.blocks, prometheus.GaugeValue, float64(w.blocks), w.name)
		ch <- prometheus.MustNewConstMetric(c.offloaded, prometheus.GaugeValue, float64(w.offloaded), w.name)
		for _, mode := range []string{"events", "approximate"} {
			v := 0.0
			if w.mode == mode {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.mode, prometheus.GaugeValue, v, w.name, mode)
		}
	}
}
