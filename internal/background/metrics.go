package background

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are kvroute_background_panics_total. A nil *Metrics records nothing.
type Metrics struct {
	panics *prometheus.CounterVec
}

// NewMetrics registers the series on reg. A nil reg returns nil: no metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	if reg == nil {
		return nil
	}
	return &Metrics{panics: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Namespace: "kvroute", Subsystem: "background", Name: "panics_total",
		Help: "Units of work of background loops that panicked, by loop (scrape, health, models, kv_events, peers, discovery, flow_control); each cost that unit alone.",
	}, []string{"loop"})}
}

// start makes the loop's series exist at 0, so that its first panic is an increase.
func (m *Metrics) start(loop string) {
	if m != nil {
		m.panics.WithLabelValues(loop)
	}
}

func (m *Metrics) panicked(loop string) {
	if m != nil {
		m.panics.WithLabelValues(loop).Inc()
	}
}
