package router

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the router's Prometheus series. A nil *Metrics records nothing.
type Metrics struct {
	fallbacks *prometheus.CounterVec
}

// NewMetrics registers kvroute_router_prompt_fallbacks_total{reason} on reg, every
// reason at 0. A nil reg returns nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	if reg == nil {
		return nil
	}
	m := &Metrics{fallbacks: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Namespace: "kvroute", Subsystem: "router", Name: "prompt_fallbacks_total",
		Help: "Requests routed by load alone because their prompt could not be encoded, by reason: unsupported_content (media parts), engine (the render endpoint failed), error (a render or tokenizer failure).",
	}, []string{"reason"})}
	for _, r := range []string{FallbackUnsupported, FallbackEngine, FallbackError} {
		m.fallbacks.WithLabelValues(r)
	}
	return m
}

func (m *Metrics) fallback(reason string) {
	if m != nil {
		m.fallbacks.WithLabelValues(reason).Inc()
	}
}
