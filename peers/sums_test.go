package peers

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/scoring"
)

// newIdleExchange is an exchange that is not run: the test drives it.
func newIdleExchange(t testing.TB, deps Deps) (*Exchange, *fakeLedger) {
	t.Helper()
	ledger := &fakeLedger{peers: map[string]scoring.Load{}}
	deps.Ledger, deps.Replica = ledger, "me"
	cfg := DefaultConfig()
	cfg.Addresses = []string{"127.0.0.1:1"}
	e, err := New(cfg, deps)
	require.NoError(t, err)
	return e, ledger
}

// summedFromScratch is what the ledger must hold: per worker, the sum over replicas of
// each one's latest report heard within StaleAfter, at any address, capped.
func summedFromScratch(e *Exchange, now time.Time) map[string]scoring.Load {
	latest := map[string]heard{}
	for _, h := range e.heard {
		if now.Sub(h.at) <= e.cfg.StaleAfter && h.at.After(latest[h.report.Replica].at) {
			latest[h.report.Replica] = h
		}
	}
	sums := map[string][3]int64{}
	for _, h := range latest {
		for _, w := range h.report.Workers {
			s := sums[w.Worker]
			sums[w.Worker] = [3]int64{s[0] + w.PrefillTokens, s[1] + w.ActiveRequests, s[2] + w.PendingRequests}
		}
	}
	out := map[string]scoring.Load{}
	for worker, s := range sums {
		if l := (scoring.Load{PrefillTokens: capped(s[0]), ActiveRequests: capped(s[1]), PendingRequests: capped(s[2])}); l != (scoring.Load{}) {
			out[worker] = l
		}
	}
	return out
}

// adaptersFromScratch is the adapters the ledger must hold: per worker, every adapter
// a latest fresh report names, with its requests summed over replicas, capped.
func adaptersFromScratch(e *Exchange, now time.Time) map[string]map[string]int {
	latest := map[string]heard{}
	for _, h := range e.heard {
		if now.Sub(h.at) <= e.cfg.StaleAfter && h.at.After(latest[h.report.Replica].at) {
			latest[h.report.Replica] = h
		}
	}
	sums := map[string]map[string]int64{}
	for _, h := range latest {
		for _, w := range h.report.Workers {
			for name, n := range w.Adapters {
				if sums[w.Worker] == nil {
					sums[w.Worker] = map[string]int64{}
				}
				sums[w.Worker][name] += n
			}
		}
	}
	out := map[string]map[string]int{}
	for worker, adapters := range sums {
		out[worker] = map[string]int{}
		for name, n := range adapters {
			out[worker][name] = capped(n)
		}
	}
	return out
}

// historiesFromScratch is the prefill history the ledger must hold now: per worker,
// the sum over the latest fresh reports of each one's history, decayed from its
// booking (the report's and the history's ages before it was heard), at the half-life
// of 30 s every report gives.
func historiesFromScratch(e *Exchange, now time.Time) map[string]float64 {
	latest := map[string]heard{}
	for _, h := range e.heard {
		if now.Sub(h.at) <= e.cfg.StaleAfter && h.at.After(latest[h.report.Replica].at) {
			latest[h.report.Replica] = h
		}
	}
	out := map[string]float64{}
	for _, h := range latest {
		for _, w := range h.report.Workers {
			if w.PrefillHistory > 0 {
				booked := h.at.Add(-time.Duration(h.report.AgeMs+w.PrefillHistoryAgeMs) * time.Millisecond)
				out[w.Worker] += float64(w.PrefillHistory) * math.Exp2(-now.Sub(booked).Seconds()/30)
			}
		}
	}
	return out
}

// TestSumsFollowEveryReportAsIfSummedFromScratch: over random reports (replicas at
// one or two addresses, restarts under a new id at an address, idle and capped
// counts, resident LoRA adapters, prefill histories booked anew or reported again
// later), addresses dropped and peers going silent, the ledger holds after each step
// what summing the latest fresh reports from scratch gives.
func TestSumsFollowEveryReportAsIfSummedFromScratch(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			c := &clock{now: time.Unix(1000, 0)}
			e, ledger := newIdleExchange(t, Deps{Now: c.Now})
			ledger.now = c.Now
			addrs := []string{"10.0.0.1:9090", "10.0.0.2:9090", "10.0.0.3:9090", "10.0.0.4:9090", "10.0.0.5:9090"}
			replicaAt := map[string]string{} // the replica each address answers for now
			// Each replica's history per worker: its tokens and when they were booked.
			type booked struct {
				tokens int64
				at     time.Time
			}
			histories := map[[2]string]booked{}
			for step := range 400 {
				// Strictly later, so "latest" names one report; the maintenance runs
				// first, as if it ran at every step.
				c.advance(time.Duration(1+rng.IntN(300)) * time.Millisecond)
				now := c.Now()
				addr := addrs[rng.IntN(len(addrs))]
				e.mu.Lock()
				e.expire(now)
				switch op := rng.IntN(10); {
				case op < 6: // a report
					if replicaAt[addr] == "" || rng.IntN(20) == 0 {
						// addresses 1 and 2 both reach replica "a"; the others are
						// their own replica, restarted under new ids
						replicaAt[addr] = fmt.Sprint("r", step)
						if addr == addrs[0] || addr == addrs[1] {
							replicaAt[addr] = "a"
						}
					}
					r := Report{Version: Version, Replica: replicaAt[addr], AgeMs: rng.Int64N(2) * rng.Int64N(200)}
					for w := range 6 {
						if rng.IntN(2) == 0 {
							n := int64(rng.IntN(4))
							if rng.IntN(30) == 0 {
								n = scoring.MaxPeerCount
							}
							wl := WorkerLoad{Worker: fmt.Sprint("w", w), ActiveRequests: n, PendingRequests: n / 2, PrefillTokens: 100 * n}
							for _, name := range []string{"sql", "chat"} {
								if rng.IntN(3) == 0 {
									if wl.Adapters == nil {
										wl.Adapters = map[string]int64{}
									}
									wl.Adapters[name] = rng.Int64N(n + 1) // resident, with 0 to n requests
								}
							}
							key := [2]string{r.Replica, wl.Worker}
							if rng.IntN(3) == 0 { // a new booking: a history never seen before
								// written AgeMs ago, booked up to 500 ms before that
								written := now.Add(-time.Duration(r.AgeMs) * time.Millisecond)
								histories[key] = booked{int64(10*step + w + 1), written.Add(-time.Duration(rng.IntN(500)) * time.Millisecond)}
							}
							if h, ok := histories[key]; ok && rng.IntN(4) > 0 {
								wl.PrefillHistory, wl.PrefillHistoryHalfLife = h.tokens, 30
								wl.PrefillHistoryAgeMs = now.Add(-time.Duration(r.AgeMs) * time.Millisecond).Sub(h.at).Milliseconds()
							}
							r.Workers = append(r.Workers, wl)
						}
					}
					e.hear(addr, r, now)
				case op < 7:
					e.forget(addr)
				}
				want, wantAdapters := summedFromScratch(e, now), adaptersFromScratch(e, now)
				wantHistories := historiesFromScratch(e, now)
				require.Empty(t, e.sums.historyChanged, "every changed history given, after step %d", step)
				e.mu.Unlock()
				gotHistories := ledger.historiesAt(now, 30)
				require.Len(t, gotHistories, len(wantHistories), "histories after step %d: %v, want %v", step, gotHistories, wantHistories)
				for worker, h := range wantHistories {
					require.InDelta(t, h, gotHistories[worker], 1e-9*h, "%s's history after step %d", worker, step)
				}
				if !maps.Equal(ledger.get(), want) {
					require.Equal(t, want, ledger.get(), "after step %d", step)
				}
				if got := ledger.getAdapters(); !reflect.DeepEqual(got, wantAdapters) && (len(got) > 0 || len(wantAdapters) > 0) {
					require.Equal(t, wantAdapters, got, "adapters after step %d", step)
				}
			}
		})
	}
}

// BenchmarkReportFrom1Of64PeersWithHistories is BenchmarkReportFrom1Of64Peers with a
// prefill history on each of the 64 workers, one of which a booking changed since the
// peer's last report: only that worker's sum over the peers is recomputed.
func BenchmarkReportFrom1Of64PeersWithHistories(b *testing.B) {
	e, _ := newIdleExchange(b, Deps{})
	now := time.Unix(1000, 0)
	var reports [64][2]Report
	for p := range reports {
		for v := range reports[p] {
			loads := map[string]scoring.Load{}
			histories := map[string]scoring.History{}
			for i := range 64 {
				name := fmt.Sprintf("vllm-qwen3-8b-7c9f8d6b5-%05d", i)
				loads[name] = scoring.Load{PrefillTokens: 12000, ActiveRequests: 40 + v*(i%2), PendingRequests: 6}
				histories[name] = scoring.History{Tokens: 123456, Age: time.Second, HalfLife: 30}
			}
			histories[fmt.Sprintf("vllm-qwen3-8b-7c9f8d6b5-%05d", p)] = scoring.History{Tokens: float64(200000 + v), HalfLife: 30}
			line, _ := reportOf(fmt.Sprint("replica-", p), loads, nil, histories)
			r, err := parseReport(line)
			require.NoError(b, err)
			reports[p][v] = r
		}
	}
	benchmarkHearing(b, e, &reports, now)
}

// pipeTransport answers every request with the body the test writes.
type pipeTransport struct{ body io.ReadCloser }

func (p pipeTransport) RoundTrip(*http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: http.StatusOK, Body: p.body, Header: http.Header{}}, nil
}

// TestAStoppedWatchRecordsNothing: reports that arrive on a watch after it was stopped
// (its address dropped, or the exchange ending) reach neither the sums nor the metrics.
func TestAStoppedWatchRecordsNothing(t *testing.T) {
	body, write := io.Pipe()
	reg := prometheus.NewRegistry()
	e, ledger := newIdleExchange(t, Deps{Client: &http.Client{Transport: pipeTransport{body}}, Metrics: NewMetrics(reg)})
	watchCtx, stop := context.WithCancel(context.Background())
	ended := make(chan error, 1)
	go func() { _, err := e.stream(watchCtx, "10.0.0.9:9090"); ended <- err }()

	_, err := io.WriteString(write, `{"version":1,"replica":"p","workers":[{"worker":"w","active_requests":2}]}`+"\n")
	require.NoError(t, err)
	eventuallyLedger(t, ledger, map[string]scoring.Load{"w": {ActiveRequests: 2}}, "the first report")

	e.mu.Lock() // as maintain stops a watch
	stop()
	e.mu.Unlock()
	_, err = io.WriteString(write, `{"version":1,"replica":"p","workers":[{"worker":"w","active_requests":5}]}`+"\n")
	require.NoError(t, err)
	require.NoError(t, write.Close()) // a stream that records the report must end too, not hang the test
	require.Error(t, <-ended)
	assert.Equal(t, map[string]scoring.Load{"w": {ActiveRequests: 2}}, ledger.get(), "the report after the stop is not counted")
	assert.Equal(t, 1.0, testutil.ToFloat64(e.deps.Metrics.reports.WithLabelValues("ok")))

	// A refused report on a stopped watch is not counted either.
	body, write = io.Pipe()
	e.deps.Client = &http.Client{Transport: pipeTransport{body}}
	go func() { _, err := e.stream(watchCtx, "10.0.0.9:9090"); ended <- err }()
	go func() { _, _ = io.WriteString(write, strings.Repeat("x", 10)+"\n") }()
	require.Error(t, <-ended)
	assert.Zero(t, testutil.ToFloat64(e.deps.Metrics.reports.WithLabelValues("refused")))
}

// BenchmarkReportFrom1Of64Peers is what summing one peer's report in costs a replica
// that hears 64, each reporting 64 busy workers, half of whose counts changed since
// its last report: the parse is not included (BenchmarkParseReportOf64BusyWorkers).
func BenchmarkReportFrom1Of64Peers(b *testing.B) {
	e, _ := newIdleExchange(b, Deps{})
	now := time.Unix(1000, 0)
	// Two reports per peer, told apart by every other worker's count, heard in turn.
	var reports [64][2]Report
	for p := range reports {
		for v := range reports[p] {
			loads := map[string]scoring.Load{}
			for i := range 64 {
				loads[fmt.Sprintf("vllm-qwen3-8b-7c9f8d6b5-%05d", i)] = scoring.Load{PrefillTokens: 12000, ActiveRequests: 40 + v*(i%2), PendingRequests: 6}
			}
			r, err := parseReport(reportLine(fmt.Sprint("replica-", p), loads, nil))
			require.NoError(b, err)
			reports[p][v] = r
		}
	}
	benchmarkHearing(b, e, &reports, now)
}

// benchmarkHearing has e hear each of 64 peers' first report, then, in the loop, each
// peer's two reports in turn.
func benchmarkHearing(b *testing.B, e *Exchange, reports *[64][2]Report, now time.Time) {
	for p := range reports {
		e.hear(fmt.Sprintf("10.0.0.%d:9090", p), reports[p][0], now)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		p := i % 64
		e.mu.Lock()
		e.hear(fmt.Sprintf("10.0.0.%d:9090", p), reports[p][(i/64)%2], now)
		e.mu.Unlock()
	}
}
