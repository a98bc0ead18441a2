package rewrite

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the rewrites' Prometheus series. A nil *Metrics records nothing.
type Metrics struct {
	chosen *prometheus.CounterVec
}

// NewMetrics registers the series on reg. A nil reg returns nil: no metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	if reg == nil {
		return nil
	}
	return &Metrics{chosen: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Namespace: "kvroute", Subsystem: "rewrite", Name: "requests_total",
		Help: "Requests whose model a model rewrite (model_rewrites, or an InferenceModelRewrite of the pool) matched, by the rewrite's name and the target model drawn: both are the config's or the cluster's, never the client's.",
	}, []string{"rewrite", "target"})}
}

func (m *Metrics) chose(c Choice) {
	if m == nil {
		return
	}
	m.chosen.WithLabelValues(c.Rewrite, c.Target).Inc()
}

// forget drops the series of a rewrite's target no longer in force.
func (m *Metrics) forget(rewrite, target string) {
	if m == nil {
		return
	}
	m.chosen.DeleteLabelValues(rewrite, target)
}
