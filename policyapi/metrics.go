package policyapi

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the policy API's Prometheus series. A nil *Metrics records nothing.
type Metrics struct {
	updates *prometheus.CounterVec
}

// NewMetrics registers the policy API's series on reg. A nil reg returns nil: no metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	if reg == nil {
		return nil
	}
	return &Metrics{updates: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Namespace: "kvroute", Subsystem: "policy", Name: "updates_total",
		Help: "Runtime policy updates through the admin API, by result (applied, rejected).",
	}, []string{"result"})}
}

func (m *Metrics) updated(result string) {
	if m != nil {
		m.updates.WithLabelValues(result).Inc()
	}
}
