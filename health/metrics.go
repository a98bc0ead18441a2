package health

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the health tracker's Prometheus series. A nil *Metrics records nothing.
type Metrics struct {
	eligible *prometheus.GaugeVec
	failures *prometheus.CounterVec
}

// NewMetrics registers the tracker's series on reg. A nil reg returns nil: no metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	if reg == nil {
		return nil
	}
	f := promauto.With(reg)
	return &Metrics{
		eligible: f.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "kvroute", Subsystem: "worker", Name: "eligible",
			Help: "1 while the worker may be chosen, 0 while it is out for a health back-off.",
		}, []string{"worker"}),
		failures: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "worker", Name: "health_failures_total",
			Help: "Failed health probes (source=probe) and 5xx upstream responses (source=response) per worker.",
		}, []string{"worker", "source"}),
	}
}

func (m *Metrics) setEligible(worker string, eligible bool) {
	if m == nil {
		return
	}
	v := 0.0
	if eligible {
		v = 1
	}
	m.eligible.WithLabelValues(worker).Set(v)
}

func (m *Metrics) failed(worker, source string) {
	if m != nil {
		m.failures.WithLabelValues(worker, source).Inc()
	}
}

// forget drops a removed worker's series, so labels stay bounded by the fleet.
func (m *Metrics) forget(worker string) {
	if m != nil {
		m.eligible.DeleteLabelValues(worker)
		m.failures.DeletePartialMatch(prometheus.Labels{"worker": worker})
	}
}
