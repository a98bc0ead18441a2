package peers

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the exchange's Prometheus series. A nil *Metrics records nothing.
type Metrics struct {
	live  prometheus.Gauge
	polls *prometheus.CounterVec
}

// NewMetrics registers kvroute_peers_live and kvroute_peers_polls_total. A nil reg
// returns nil: no metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	if reg == nil {
		return nil
	}
	m := &Metrics{
		live: promauto.With(reg).NewGauge(prometheus.GaugeOpts{Namespace: "kvroute", Subsystem: "peers", Name: "live",
			Help: "Other kvroute replicas whose booked load is counted (answered within peers.stale_after)."}),
		polls: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute", Subsystem: "peers", Name: "polls_total",
			Help: "Polls of other replicas' booked load, by result (ok, error: unreachable, late, or a refused report)."}, []string{"result"}),
	}
	m.polls.WithLabelValues("ok")
	m.polls.WithLabelValues("error")
	return m
}

func (m *Metrics) polled(err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.polls.WithLabelValues(result).Inc()
}

func (m *Metrics) setLive(n int) {
	if m != nil {
		m.live.Set(float64(n))
	}
}
