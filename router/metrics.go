package router

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the router's Prometheus series. A nil *Metrics records nothing.
type Metrics struct {
	fallbacks   *prometheus.CounterVec
	cuts        prometheus.Counter
	pastContext *prometheus.CounterVec
	sheds       prometheus.Counter
}

// NewMetrics registers kvroute_router_prompt_fallbacks_total{reason}, every reason at
// 0, kvroute_router_prompts_cut_total,
// kvroute_router_prompts_past_context_total{candidates} (some, all) and
// kvroute_router_sheddable_shed_total on reg. A nil reg returns nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	if reg == nil {
		return nil
	}
	m := &Metrics{fallbacks: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Namespace: "kvroute", Subsystem: "router", Name: "prompt_fallbacks_total",
		Help: "Requests routed by load alone because their prompt could not be encoded, by reason: unsupported_content (media parts), engine (the render endpoint failed), error (a render or tokenizer failure).",
	}, []string{"reason"}),
		cuts: promauto.With(reg).NewCounter(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "router", Name: "prompts_cut_total",
			Help: "Requests routed on the first ids of their prompt text, whose encoding stopped at max_prompt_tokens ids or at the tokenizer's bound on long words (the rest's tokens estimated from its bytes).",
		}),
		pastContext: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "router", Name: "prompts_past_context_total",
			Help: "Requests whose prompt ids (with their max_tokens) reach the context (max_model_len) of some candidates, which were left out (candidates=\"some\"), or whose prompt ids reach that of all of them, whose engine refuses it: routed with no prefill booked and nothing recorded (candidates=\"all\").",
		}, []string{"candidates"}),
		sheds: promauto.With(reg).NewCounter(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "router", Name: "sheddable_shed_total",
			Help: "Sheddable requests (their objective's priority below 0) refused with a 429 because no candidate had capacity: fresh engine metrics, a queue of at most priority.queue_depth_threshold and KV use of at most priority.kv_cache_util_threshold.",
		})}
	m.pastContext.WithLabelValues("some")
	m.pastContext.WithLabelValues("all")
	for _, r := range []string{FallbackUnsupported, FallbackEngine, FallbackError} {
		m.fallbacks.WithLabelValues(r)
	}
	return m
}

func (m *Metrics) cut() {
	if m != nil {
		m.cuts.Inc()
	}
}

func (m *Metrics) shed() {
	if m != nil {
		m.sheds.Inc()
	}
}

func (m *Metrics) fallback(reason string) {
	if m != nil {
		m.fallbacks.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) contextFit(fit contextFit) {
	if m == nil {
		return
	}
	switch {
	case fit.exceeded:
		m.pastContext.WithLabelValues("all").Inc()
	case fit.narrowed:
		m.pastContext.WithLabelValues("some").Inc()
	}
}
