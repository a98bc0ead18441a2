package server

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the server's Prometheus series. A nil *Metrics records nothing.
type Metrics struct {
	panics *prometheus.CounterVec
}

// NewMetrics registers the server's series on reg. A nil reg returns nil: no metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	if reg == nil {
		return nil
	}
	return &Metrics{panics: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Namespace: "kvroute", Subsystem: "server", Name: "panics_total",
		Help: "gRPC calls that panicked, by method; each failed only its own stream or call (gRPC Internal).",
	}, []string{"method"})}
}

func (m *Metrics) panicked(method string) {
	if m != nil {
		m.panics.WithLabelValues(method).Inc()
	}
}
