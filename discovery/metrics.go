package discovery

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are discovery's Prometheus series. A nil *Metrics records nothing.
type Metrics struct {
	updates *prometheus.CounterVec
	workers prometheus.Gauge
	synced  prometheus.Gauge
	stale   prometheus.Gauge
}

// NewMetrics registers discovery's series on reg. A nil reg returns nil: no metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	if reg == nil {
		return nil
	}
	f := promauto.With(reg)
	return &Metrics{
		updates: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "discovery", Name: "updates_total",
			Help: "Worker sets from discovery, by result: applied (the fleet changed), rejected (bad input; the workers in force stay).",
		}, []string{"result"}),
		workers: f.NewGauge(prometheus.GaugeOpts{
			Namespace: "kvroute", Subsystem: "discovery", Name: "workers",
			Help: "Workers in the set discovery applied last.",
		}),
		synced: f.NewGauge(prometheus.GaugeOpts{
			Namespace: "kvroute", Subsystem: "discovery", Name: "synced",
			Help: "1 once discovery has delivered its first complete worker set.",
		}),
		stale: f.NewGauge(prometheus.GaugeOpts{
			Namespace: "kvroute", Subsystem: "discovery", Name: "stale",
			Help: "1 while the source's latest input was rejected and the workers in force come from an earlier one.",
		}),
	}
}

func (m *Metrics) applied(workers int) {
	if m != nil {
		m.updates.WithLabelValues("applied").Inc()
		m.workers.Set(float64(workers))
		m.synced.Set(1)
		m.stale.Set(0)
	}
}

func (m *Metrics) rejected() {
	if m != nil {
		m.updates.WithLabelValues("rejected").Inc()
		m.stale.Set(1)
	}
}

func (m *Metrics) setSynced(on bool) {
	if m != nil {
		m.synced.Set(b2f(on))
	}
}

func (m *Metrics) setStale(on bool) {
	if m != nil {
		m.stale.Set(b2f(on))
	}
}

func b2f(on bool) float64 {
	if on {
		return 1
	}
	return 0
}
