package filter

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/kvroute/kvroute/router"
)

// Metrics are the filter's Prometheus series. A nil *Metrics records nothing.
type Metrics struct {
	requests       *prometheus.CounterVec
	converted      *prometheus.CounterVec
	responses      *prometheus.CounterVec
	streamErrors   *prometheus.CounterVec
	allOutRoutes   prometheus.Counter
	loraUnlisted   prometheus.Counter
	modelUnlisted  prometheus.Counter
	stageSeconds   [numStages]prometheus.Observer // indexed by stage
	nonMaxOverlap  prometheus.Counter
	blocksLost     prometheus.Histogram
	predictedHit   prometheus.Histogram
	reportedPrompt prometheus.Counter
	reportedCached prometheus.Counter
	rejectedUsage  prometheus.Counter
	splits         *prometheus.CounterVec
	servedElse     *prometheus.CounterVec
}

// The decision stages of kvroute_filter_decision_duration_seconds, in order.
const (
	stageParse = iota
	stageTokenize
	stageHash
	stageLookup
	stageScore
	numStages
)

var stageNames = [numStages]string{"parse", "tokenize", "hash", "lookup", "score"}

// NewMetrics registers the filter's series on reg. A nil reg returns nil: no metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	if reg == nil {
		return nil
	}
	f := promauto.With(reg)
	m := &Metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "filter", Name: "requests_total",
			Help: "Requests seen, by how kvroute answered: routed (by prefix and load), load_only (no body to read), load_only_busy (a body max_concurrent_body_bytes left no room to decode, routed by load on its model), or the error class.",
		}, []string{"outcome"}),
		converted: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "filter", Name: "converted_requests_total",
			Help: "Routed requests of the APIs vLLM converts to a chat (responses_paths, messages_paths) whose body kvroute read, by api (responses, messages) and outcome: routed (on the chat rebuilt from the body), load_only (a body the rebuild does not take, or one naming a stored response), load_only_busy (max_concurrent_body_bytes left no room).",
		}, []string{"api", "outcome"}),
		responses: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "filter", Name: "completions_total",
			Help: "Routed requests whose booking was released, by worker and outcome (success, upstream_error, cancelled).",
		}, []string{"worker", "outcome"}),
		streamErrors: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "filter", Name: "stream_errors_total",
			Help: "ext_proc streams that ended abnormally, by reason.",
		}, []string{"reason"}),
		allOutRoutes: f.NewCounter(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "filter", Name: "routed_all_out_total",
			Help: "Requests routed while every candidate worker, or every one whose context the prompt fits, was out for a health back-off: kvroute then ignores health rather than refuse.",
		}),
		loraUnlisted: f.NewCounter(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "filter", Name: "lora_unlisted_total",
			Help: "LoRA adapter requests routed among every worker of the base model (without lora_adapters of its own) because no destination names the adapter in its lora_adapters or its engine's model list.",
		}),
		modelUnlisted: f.NewCounter(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "filter", Name: "model_unlisted_total",
			Help: "Requests routed among every worker configured to serve their model (an adapter's base model) because no destination serves it by config or names it in its engine's model list (models no engine lists, or lists out of date).",
		}),
		servedElse: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "filter", Name: "served_elsewhere_total",
			Help: "Responses the data plane reports served by another endpoint than the chosen worker (x-gateway-destination-endpoint-served), by result: moved (another of the decision's candidates, listed as a fallback or not: the booking, recorded blocks and session went with it) or unlisted (an endpoint that was none of its candidates: nothing moved).",
		}, []string{"result"}),
		nonMaxOverlap: f.NewCounter(prometheus.CounterOpts{
			Namespace: "kvroute", Name: "non_max_overlap_selections_total",
			Help: "Decisions whose chosen worker held fewer leading blocks than another eligible worker.",
		}),
		blocksLost: f.NewHistogram(prometheus.HistogramOpts{
			Namespace: "kvroute", Name: "overlap_blocks_lost",
			Help:    "Cached blocks given up by a non-max-overlap selection (max overlap − chosen overlap).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
		predictedHit: f.NewHistogram(prometheus.HistogramOpts{
			Namespace: "kvroute", Subsystem: "filter", Name: "predicted_cache_hit_ratio",
			Help:    "Share of each routed prompt the chosen worker was predicted to hold.",
			Buckets: prometheus.LinearBuckets(0, 0.1, 11),
		}),
		reportedPrompt: f.NewCounter(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "filter", Name: "reported_prompt_tokens_total",
			Help: "Prompt tokens reported in responses' usage.",
		}),
		reportedCached: f.NewCounter(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "filter", Name: "reported_cached_tokens_total",
			Help: "Cached prompt tokens reported in responses' usage (prompt_tokens_details.cached_tokens).",
		}),
		rejectedUsage: f.NewCounter(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "filter", Name: "usage_rejected_total",
			Help: "Responses whose usage object was ignored: counts negative, fractional, above 2^31, or cached above prompt tokens.",
		}),
	}
	m.splits = f.NewCounterVec(prometheus.CounterOpts{
		Namespace: "kvroute", Subsystem: "filter", Name: "disaggregation_total",
		Help: "Routed requests in fleets with prefill workers, by how they were split: prefill (by the prefill worker named, then decoded by the destination), under_threshold (the destination missed fewer than disaggregate_tokens), no_prefill_worker (none eligible) or whole_api (an API the routing sidecar does not split: SGLang's /generate).",
	}, []string{"outcome", "prefill_worker"})
	stages := f.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "kvroute", Subsystem: "filter", Name: "decision_duration_seconds",
		Help: "Time spent per decision stage (parse, tokenize, hash, lookup, score).",
		// Doubling from 1 µs to 0.5 s: a quantile read from the buckets is within a
		// factor of 2 (×4 buckets left a p99 anywhere in 256 µs-1 ms).
		Buckets: prometheus.ExponentialBuckets(1e-6, 2, 20),
	}, []string{"stage"})
	for i, name := range stageNames {
		m.stageSeconds[i] = stages.WithLabelValues(name)
	}
	return m
}

func (m *Metrics) request(outcome string) {
	if m != nil {
		m.requests.WithLabelValues(outcome).Inc()
	}
}

// convertedRequest counts a routed Responses or Messages request by how its body was
// read (converted_requests_total).
func (m *Metrics) convertedRequest(api, outcome string) {
	if m != nil {
		m.converted.WithLabelValues(api, outcome).Inc()
	}
}

func (m *Metrics) servedElsewhere(result string) {
	if m == nil {
		return
	}
	m.servedElse.WithLabelValues(result).Inc()
}

func (m *Metrics) allOut() {
	if m != nil {
		m.allOutRoutes.Inc()
	}
}

func (m *Metrics) streamError(reason string) {
	if m != nil {
		m.streamErrors.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) released(worker, outcome string) {
	if m != nil {
		m.responses.WithLabelValues(worker, outcome).Inc()
	}
}

func (m *Metrics) decided(d *router.Decision, parse time.Duration) {
	if m == nil {
		return
	}
	for i, v := range [numStages]time.Duration{parse, d.Timings.Tokenize, d.Timings.Hash, d.Timings.Lookup, d.Timings.Score} {
		m.stageSeconds[i].Observe(v.Seconds())
	}
	if d.NonMaxOverlap() {
		m.nonMaxOverlap.Inc()
		m.blocksLost.Observe(float64(d.BlocksLost))
	}
	if d.LoRAUnlisted {
		m.loraUnlisted.Inc()
	}
	if d.ModelUnlisted {
		m.modelUnlisted.Inc()
	}
	if d.PromptTokens > 0 {
		m.predictedHit.Observe(float64(d.PredictedCachedTokens) / float64(d.PromptTokens))
	}
	switch {
	case d.Prefill != nil:
		m.splits.WithLabelValues("prefill", d.Prefill.Worker).Inc()
	case d.DecodeOnly != "":
		m.splits.WithLabelValues(d.DecodeOnly, "").Inc()
	}
}

func (m *Metrics) usage(prompt, cached int64) {
	if m != nil {
		m.reportedPrompt.Add(float64(prompt))
		m.reportedCached.Add(float64(cached))
	}
}

func (m *Metrics) usageRejected() {
	if m != nil {
		m.rejectedUsage.Inc()
	}
}
