package filter

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/internal/poll"
)

// SetWorkers drops the per-worker series of workers no longer in the fleet: discovered
// workers are pods, which come and go under new names at every rollout, and their names
// must not pile up as label values. That is the completions of destinations (worker)
// and the splits of prefill workers (prefill_worker). A worker's requests still in
// flight when it leaves count again under its name when they end, until the next fleet
// change. It makes *Metrics a fleet.Watcher; a nil *Metrics does nothing.
func (m *Metrics) SetWorkers(workers []poll.Target) {
	if m == nil {
		return
	}
	keep := make(map[string]bool, len(workers))
	for _, w := range workers {
		keep[w.Name] = true
	}
	dropGone(m.responses, "worker", keep)
	dropGone(m.splits, "prefill_worker", keep)
}

// dropGone deletes vec's series whose label names a worker not in keep. An empty value
// names no worker (a split's decode-only outcomes): those series stay.
func dropGone(vec *prometheus.CounterVec, label string, keep map[string]bool) {
	series := make(chan prometheus.Metric, 64)
	go func() { vec.Collect(series); close(series) }()
	gone := map[string]bool{}
	for s := range series {
		var out dto.Metric
		if s.Write(&out) != nil {
			continue
		}
		for _, l := range out.GetLabel() {
			if l.GetName() == label && l.GetValue() != "" && !keep[l.GetValue()] {
				gone[l.GetValue()] = true
			}
		}
	}
	for name := range gone {
		vec.DeletePartialMatch(prometheus.Labels{label: name})
	}
}
