package peers

import (
	"math"
	"time"

	"github.com/kvroute/kvroute/scoring"
)

// sums keeps, per worker, the sum of one report per replica, updated by the workers a
// new report names. Summing every peer's report again on each report would cost every
// replica (peers × workers) per report, so (peers² × workers) per interval across the
// fleet.
//
// Prefill histories do not sum as counts do: each decays from its own booking. They
// are kept per replica and worker (histories), and summed afresh for a worker whose
// entries changed (historyChanged, which give takes).
type sums struct {
	counted map[string]countedReport // by replica id: its report in the totals
	totals  map[string]total         // by worker; absent when all zero
	// histories is, by replica and then worker, each counted report's prefill
	// histories; a replica without any is absent.
	histories      map[string]map[string]*anchoredHistory
	historyChanged map[string]struct{} // workers whose histories changed since taken
	historyCounts  uint64              // countHistories calls, to mark what each saw
}

// anchoredHistory is one replica's prefill history on a worker: tokens as of at on
// this replica's clock (when the report's line was heard, less the line's age and
// the history's), decaying by half every halfLife seconds.
type anchoredHistory struct {
	tokens, halfLife float64
	at               time.Time
	counted          uint64 // the countHistories call that last saw it
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
	return &sums{counted: map[string]countedReport{}, totals: map[string]total{},
		histories: map[string]map[string]*anchoredHistory{}, historyChanged: map[string]struct{}{}}
}

// count makes c the report its replica's counts come from, and returns the workers
// whose sums may have changed.
func (s *sums) count(c countedReport) (touched []string) {
	old, had := s.counted[c.report.Replica]
	if had {
		delete(s.counted, c.report.Replica)
		touched = s.add(old.report.Workers, -1)
	}
	s.counted[c.report.Replica] = c
	touched = append(touched, s.add(c.report.Workers, 1)...)
	s.countHistories(c)
	return touched
}

// uncount removes a replica's counts, and returns the workers whose sums may have
// changed.
func (s *sums) uncount(replica string) (touched []string) {
	old, ok := s.counted[replica]
	if !ok {
		return nil
	}
	delete(s.counted, replica)
	for worker := range s.histories[replica] {
		s.historyChanged[worker] = struct{}{}
	}
	delete(s.histories, replica)
	return s.add(old.report.Workers, -1)
}

// countHistories makes c's prefill histories its replica's, in place of those of the
// report it replaces. A history the replica reported already, the same tokens with the
// same half-life, is the same one (they change only with a booking on the worker): it
// keeps the moment it was first dated, and the workers' sums are not recomputed for
// every report. In the steady state that is one map lookup per worker.
func (s *sums) countHistories(c countedReport) {
	replica := c.report.Replica
	written := c.at.Add(-msAge(c.report.AgeMs))
	s.historyCounts++
	own := s.histories[replica]
	seen := 0
	for _, w := range c.report.Workers {
		if w.PrefillHistory == 0 {
			continue
		}
		seen++
		tokens := float64(w.PrefillHistory)
		if h := own[w.Worker]; h != nil && h.tokens == tokens && h.halfLife == w.PrefillHistoryHalfLife && written.Add(-msAge(w.PrefillHistoryAgeMs)).Sub(h.at).Abs() < time.Second {
			h.counted = s.historyCounts
			continue
		}
		if own == nil {
			own = map[string]*anchoredHistory{}
			s.histories[replica] = own
		}
		own[w.Worker] = &anchoredHistory{tokens: tokens, halfLife: w.PrefillHistoryHalfLife,
			at: written.Add(-msAge(w.PrefillHistoryAgeMs)), counted: s.historyCounts}
		s.historyChanged[w.Worker] = struct{}{}
	}
	if len(own) > seen { // some c did not report (report checks refuse a repeated worker)
		for worker, h := range own {
			if h.counted != s.historyCounts {
				delete(own, worker)
				s.historyChanged[worker] = struct{}{}
			}
		}
	}
	if own != nil && len(own) == 0 {
		delete(s.histories, replica)
	}
}

// msAge is an age in a report, in milliseconds, as a Duration; one beyond a Duration's
// range (292 years) is the longest. Ages are checked ≥ 0 (Report.check).
func msAge(ms int64) time.Duration {
	return time.Duration(min(ms, math.MaxInt64/int64(time.Millisecond))) * time.Millisecond
}

// takeHistoryChanged reports whether worker's histories changed since it was last
// taken.
func (s *sums) takeHistoryChanged(worker string) bool {
	_, ok := s.historyChanged[worker]
	delete(s.historyChanged, worker)
	return ok
}

// history is the replicas' prefill history on worker at now, summed: each decayed
// from its moment with the half-life its replica gave it. The ledger decays the sum
// from now with the half-life in force for each request.
func (s *sums) history(worker string, now time.Time) float64 {
	sum := 0.0
	for _, own := range s.histories {
		if h := own[worker]; h != nil {
			sum += scoring.History{Tokens: h.tokens, HalfLife: h.halfLife}.After(now.Sub(h.at))
		}
	}
	return sum
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
