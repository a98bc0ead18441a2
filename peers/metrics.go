package peers

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the exchange's Prometheus series. A nil *Metrics records nothing.
type Metrics struct {
	live        prometheus.Gauge
	reports     *prometheus.CounterVec
	disconnects prometheus.Counter
}

// NewMetrics registers kvroute_peers_live, kvroute_peers_reports_total and
// kvroute_peers_disconnects_total. A nil reg returns nil: no metrics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	if reg == nil {
		return nil
	}
	m := &Metrics{
		live: promauto.With(reg).NewGauge(prometheus.GaugeOpts{Namespace: "kvroute", Subsystem: "peers", Name: "live",
			Help: "Other kvroute replicas whose booked load is counted (heard from within peers.stale_after)."}),
		reports: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute", Subsystem: "peers", Name: "reports_total",
			Help: "Reports of booked load received from other replicas, by result: ok, or refused (malformed or out of bounds; the stream is dropped)."}, []string{"result"}),
		disconnects: promauto.With(reg).NewCounter(prometheus.CounterOpts{Namespace: "kvroute", Subsystem: "peers", Name: "disconnects_total",
			Help: "Watch streams to other replicas that could not be opened or broke (then reopened with back-off); a stream the peer ends cleanly after reporting (every minute, or shutting down) is not counted."}),
	}
	m.reports.WithLabelValues("ok")
	m.reports.WithLabelValues("refused")
	return m
}

func (m *Metrics) reported(ok bool) {
	if m == nil {
		return
	}
	result := "ok"
	if !ok {
		result = "refused"
	}
	m.reports.WithLabelValues(result).Inc()
}

func (m *Metrics) disconnected() {
	if m != nil {
		m.disconnects.Inc()
	}
}

func (m *Metrics) setLive(n int) {
	if m != nil {
		m.live.Set(float64(n))
	}
}
