package engine

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the render clients' Prometheus series, shared by every model's client.
// A nil *Metrics records nothing.
type Metrics struct {
	renders *prometheus.CounterVec
	seconds *prometheus.HistogramVec
}

// NewMetrics registers kvroute_engine_renders_total{model,outcome} and
// kvroute_engine_render_duration_seconds{model} on reg. The model label is bounded by
// the configuration: only models configured with an engine have a client. A nil reg
// returns nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	if reg == nil {
		return nil
	}
	f := promauto.With(reg)
	return &Metrics{
		renders: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "engine", Name: "renders_total",
			Help: "Prompts sent to an engine's render endpoint, by model and outcome (ok, busy, timeout, unreachable, error_status, unauthorized, bad_reply, canceled); every outcome but ok routes the request by load.",
		}, []string{"model", "outcome"}),
		seconds: f.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "kvroute", Subsystem: "engine", Name: "render_duration_seconds",
			Help:    "Time of a render request to the engine, reply parsed, whatever its outcome.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"model"}),
	}
}

func (m *Metrics) observe(model, outcome string, d time.Duration) {
	if m == nil {
		return
	}
	m.renders.WithLabelValues(model, outcome).Inc()
	m.seconds.WithLabelValues(model).Observe(d.Seconds())
}
