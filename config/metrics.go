package config

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the config's Prometheus series. A nil *Metrics records nothing.
type Metrics struct {
	reloads *prometheus.CounterVec
}

// NewMetrics registers the config's series on reg. A nil reg returns nil: no metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	if reg == nil {
		return nil
	}
	return &Metrics{reloads: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Namespace: "kvroute", Subsystem: "config", Name: "reloads_total",
		Help: "Config reloads (SIGHUP or POST /reload on the admin port), by result (applied, rejected).",
	}, []string{"result"})}
}

func (m *Metrics) reloaded(result string) {
	if m != nil {
		m.reloads.WithLabelValues(result).Inc()
	}
}
