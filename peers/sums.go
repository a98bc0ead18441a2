package peers

import (
	"time"

	"github.com/kvroute/kvroute/scoring"
)

// sums keeps, per worker, the sum of one report per replica, updated by the workers a
// new report names. Summing every peer's report again on each report would cost every
// replica (peers × workers) per report, so (peers² × workers) per interval across the
// fleet.
type sums struct {
	counted map[string]countedReport // by replica id: its report in the totals
	totals  map[string]total         // by worker; absent when all zero
}

// countedReport is the report a replica's counts come from, and where and when it
// was heard.
type countedReport struct {
	addr   string
	at     time.Time
	report Report
}

// total is one worker's sums, unbounded: MaxAddresses peers at scoring.MaxPeerCount
// fit an int64, and a capped sum could not be subtracted from.
type total struct {
	prefill, active, pending int64
	// adapters sums the resident LoRA adapters; nil when none.
	adapters map[string]adapterTotal
}

// adapterTotal is one adapter's sums on a worker: the replicas that report it
// resident, and their requests booked on it.
type adapterTotal struct{ replicas, active int64 }

func (t total) zero() bool {
	return t.prefill == 0 && t.active == 0 && t.pending == 0 && len(t.adapters) == 0
}

func newSums() *sums {
	return &sums{counted: map[string]countedReport{}, totals: map[string]total{}}
}

// count makes c the report its replica's counts come from, and returns the workers
// whose sums may have changed.
func (s *sums) count(c countedReport) (touched []string) {
	touched = s.uncount(c.report.Replica)
	s.counted[c.report.Replica] = c
	return append(touched, s.add(c.report.Workers, 1)...)
}

// uncount removes a replica's counts, and returns the workers whose sums may have
// changed.
func (s *sums) uncount(replica string) (touched []string) {
	old, ok := s.counted[replica]
	if !ok {
		return nil
	}
	delete(s.counted, replica)
	return s.add(old.report.Workers, -1)
}

func (s *sums) add(workers []WorkerLoad, sign int64) (touched []string) {
	for _, w := range workers {
		t := s.totals[w.Worker]
		t.prefill += sign * w.PrefillTokens
		t.active += sign * w.ActiveRequests
		t.pending += sign * w.PendingRequests
		for name, n := range w.Adapters {
			if t.adapters == nil {
				t.adapters = map[string]adapterTotal{}
			}
			a := t.adapters[name]
			a.replicas += sign
			a.active += sign * n
			if a.replicas == 0 {
				delete(t.adapters, name)
			} else {
				t.adapters[name] = a
			}
		}
		if t.zero() {
			delete(s.totals, w.Worker)
		} else {
			s.totals[w.Worker] = t
		}
		touched = append(touched, w.Worker)
	}
	return touched
}

// load is a worker's sums as the ledger takes them: each at most scoring.MaxPeerCount.
func (s *sums) load(worker string) scoring.Load {
	t := s.totals[worker]
	return scoring.Load{PrefillTokens: capped(t.prefill), ActiveRequests: capped(t.active), PendingRequests: capped(t.pending)}
}

// adapters is a worker's resident adapters as the ledger takes them: each with its
// requests, at most scoring.MaxPeerCount; nil when none.
func (s *sums) adapters(worker string) map[string]int {
	t := s.totals[worker]
	if len(t.adapters) == 0 {
		return nil
	}
	out := make(map[string]int, len(t.adapters))
	for name, a := range t.adapters {
		out[name] = capped(a.active)
	}
	return out
}

func capped(n int64) int { return int(min(n, scoring.MaxPeerCount)) }
