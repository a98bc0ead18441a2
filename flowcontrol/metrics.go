package flowcontrol

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Outcomes of a held request (the outcome label of kvroute_flow_control_requests_total).
const (
	// OutcomeDispatched: a worker took it; it was routed.
	OutcomeDispatched = "dispatched"
	// OutcomeQueueFull: max_queued requests were held already; refused at once.
	OutcomeQueueFull = "queue_full"
	// OutcomeTimedOut: held for max_wait with no worker able to take it; refused.
	OutcomeTimedOut = "timed_out"
	// OutcomeCancelled: the client (or Envoy) went away while it was held.
	OutcomeCancelled = "cancelled"
	// OutcomeShutdown: kvroute began to drain while it was held; answered 503.
	OutcomeShutdown = "shutdown"
	// OutcomeFailed: its routing failed for another reason than capacity (the model's
	// workers left, say); answered as that error.
	OutcomeFailed = "failed"
)

// Metrics are flow control's Prometheus series. A nil *Metrics records nothing.
type Metrics struct {
	held     prometheus.Gauge
	outcomes *prometheus.CounterVec
	waited   *prometheus.HistogramVec
}

// NewMetrics registers the series on reg; a nil reg gives nil (nothing recorded).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	if reg == nil {
		return nil
	}
	m := &Metrics{
		held: promauto.With(reg).NewGauge(prometheus.GaugeOpts{
			Namespace: "kvroute", Subsystem: "flow_control", Name: "queued_requests",
			Help: "Requests held by flow control now, waiting for a worker with capacity.",
		}),
		outcomes: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "flow_control", Name: "requests_total",
			Help: "Requests flow control held (or refused at a full queue), by outcome: dispatched, queue_full, timed_out (max_wait passed), cancelled (the client went away), shutdown (kvroute began to drain) or failed (routing failed for another reason).",
		}, []string{"outcome"}),
		waited: promauto.With(reg).NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "kvroute", Subsystem: "flow_control", Name: "wait_seconds",
			Help:    "How long requests were held by flow control, by outcome (as kvroute_flow_control_requests_total, queue_full excepted).",
			Buckets: []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"outcome"}),
	}
	for _, o := range []string{OutcomeDispatched, OutcomeQueueFull, OutcomeTimedOut, OutcomeCancelled, OutcomeShutdown, OutcomeFailed} {
		m.outcomes.WithLabelValues(o)
		if o != OutcomeQueueFull {
			m.waited.WithLabelValues(o)
		}
	}
	return m
}

func (m *Metrics) setHeld(n int) {
	if m != nil {
		m.held.Set(float64(n))
	}
}

func (m *Metrics) ended(outcome string, waited time.Duration) {
	if m == nil {
		return
	}
	m.outcomes.WithLabelValues(outcome).Inc()
	if outcome != OutcomeQueueFull {
		m.waited.WithLabelValues(outcome).Observe(waited.Seconds())
	}
}
