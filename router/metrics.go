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
	stored      *prometheus.CounterVec
	sessions    *prometheus.CounterVec
}

// NewMetrics registers kvroute_router_prompt_fallbacks_total{reason}, every reason at
// 0, kvroute_router_prompts_cut_total,
// kvroute_router_prompts_past_context_total{candidates} (some, all) and
// kvroute_router_sheddable_shed_total and
// kvroute_router_stored_response_requests_total{routed} and
// kvroute_router_sglang_session_requests_total{routed} (every value at 0) on reg. A nil
// reg returns nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	if reg == nil {
		return nil
	}
	m := &Metrics{fallbacks: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Namespace: "kvroute", Subsystem: "router", Name: "prompt_fallbacks_total",
		Help: "Requests routed by load alone because their prompt could not be encoded, by reason: unsupported_content (media parts, a request's own chat_template, prompt_embeds or suffix, a truncated prompt), engine (the render endpoint failed), error (a render or tokenizer failure).",
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
			Help: "Sheddable requests (their objective's priority below 0) refused with a 429 because no candidate had capacity: fresh engine metrics, a queue of at most priority.queue_depth_threshold and KV use of at most priority.kv_cache_util_threshold. With flow_control on such requests are held instead, and counted by kvroute_flow_control_requests_total.",
		}),
		stored: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "router", Name: "stored_response_requests_total",
			Help: "Requests naming a stored Responses API response (previous_response_id, or the id of GET, cancel or delete) that were routed (not those refused), by how: stored_worker (to the worker that stored it), unknown (no response of that id seen: routed by load) or not_candidate (its worker does not serve the request: routed by load).",
		}, []string{"routed"}),
		sessions: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "router", Name: "sglang_session_requests_total",
			Help: "Requests naming an SGLang session (a /generate body's session_params.id, a /close_session body's session_id) that were routed (not those refused), by how: stored_worker (to the worker whose engine opened it), unknown (no /open_session of that id seen: routed by load) or not_candidate (its worker does not serve the request: routed by load).",
		}, []string{"routed"})}
	for _, routed := range []string{StoredResponseWorker, StoredResponseUnknown, StoredResponseNotCandidate} {
		m.stored.WithLabelValues(routed)
		m.sessions.WithLabelValues(routed)
	}
	m.pastContext.WithLabelValues("some")
	m.pastContext.WithLabelValues("all")
	for _, r := range []string{FallbackUnsupported, FallbackEngine, FallbackError} {
		m.fallbacks.WithLabelValues(r)
	}
	return m
}

// prompt counts a routed prompt's fallback or cut (Prompt.EstimatedTokens: its
// encoding stopped early).
func (m *Metrics) prompt(p Prompt) {
	switch {
	case m == nil:
	case p.Fallback != "":
		m.fallbacks.WithLabelValues(p.Fallback).Inc()
	case p.EstimatedTokens > 0:
		m.cuts.Inc()
	}
}

func (m *Metrics) shed() {
	if m != nil {
		m.sheds.Inc()
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

func (m *Metrics) storedResponse(routed string) {
	if m != nil && routed != "" {
		m.stored.WithLabelValues(routed).Inc()
	}
}

// sglangSession counts how a request naming an SGLang session was routed.
func (m *Metrics) sglangSession(routed string) {
	if m != nil && routed != "" {
		m.sessions.WithLabelValues(routed).Inc()
	}
}
