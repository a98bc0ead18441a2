package enginemetrics

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/background"
	"github.com/kvroute/kvroute/internal/background/backgroundtest"
	"github.com/kvroute/kvroute/internal/fakeclock"
)

// TestAScrapeThatPanicsFailsThatWorkersScrapeAlone: a panic in the middle of one
// worker's scrape (here in the capacity report, after the page's requests were
// reported) is recovered and counted, and the scrape ends as a failed one: the
// engine's requests read as unknown and its last load stands, while the other worker
// of the round is read; the next round reads both again.
func TestAScrapeThatPanicsFailsThatWorkersScrapeAlone(t *testing.T) {
	// An engine whose page says waiting requests (5 run) and its KV capacity.
	type engine struct{ waiting, blocks atomic.Int32 }
	serve := func(e *engine) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			fmt.Fprint(w, page(fmt.Sprint(e.waiting.Load()), "0.5")+cacheConfig("16", fmt.Sprint(e.blocks.Load())))
		}))
		t.Cleanup(srv.Close)
		return srv.Listener.Addr().String()
	}
	var a, b engine
	a.waiting.Store(1)
	a.blocks.Store(1000)
	b.blocks.Store(1000)
	clock := fakeclock.New(time.Unix(1000, 0))
	s, err := New(DefaultConfig(), []Worker{{Name: "a", Address: serve(&a)}, {Name: "b", Address: serve(&b)}}, nil, clock.Now, nil)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	s.CountPanics(background.NewMetrics(reg))
	requests := &reports{last: map[string]int{}}
	s.ReportRequests(requests.report)
	var capacities atomic.Int32
	s.ReportCapacity(16, func(worker, _ string, _ int) {
		if worker == "a" && capacities.Add(1) == 2 {
			panic("injected fault") // at its second report, a change of capacity
		}
	})
	ctx := context.Background()
	s.ScrapeAll(ctx)
	require.Equal(t, 0.0, backgroundtest.Panics(t, reg, background.LoopScrape))

	a.waiting.Store(7)
	a.blocks.Store(2000)
	b.waiting.Store(3)
	clock.Advance(time.Second)
	s.ScrapeAll(ctx)
	assert.Equal(t, 1.0, backgroundtest.Panics(t, reg, background.LoopScrape))
	n, _ := requests.get("a")
	assert.Equal(t, -1, n, "the panicking scrape failed: the engine's requests are unknown")
	waiting, _, age, ok := s.EngineLoad("a")
	assert.True(t, ok)
	assert.Equal(t, 1, waiting, "and the last load stands while fresh")
	assert.Equal(t, time.Second, age)
	waiting, _, _, _ = s.EngineLoad("b")
	assert.Equal(t, 3, waiting, "the other worker of the round was read")

	a.blocks.Store(3000)
	clock.Advance(time.Second)
	s.ScrapeAll(ctx)
	waiting, _, age, _ = s.EngineLoad("a")
	assert.Equal(t, 7, waiting, "the next round read it")
	assert.Zero(t, age)
	n, _ = requests.get("a")
	assert.Equal(t, 12, n)
	assert.Equal(t, int32(3), capacities.Load())
	assert.Equal(t, 1.0, backgroundtest.Panics(t, reg, background.LoopScrape), "one panic, counted once")
}

// TestACapacityWhoseReportPanickedIsReportedAgain: a scrape whose capacity report
// panics (a bug the new capacity reaches in the fleet or the index, above the report)
// failed, and a failed scrape reports no capacity: the next scrape of the same
// capacity reports it. Recorded as reported before the report ran, it was never
// reported again while the engine's capacity stayed the same: the index kept the
// default capacity for good.
func TestACapacityWhoseReportPanickedIsReportedAgain(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, page("0", "0.5")+cacheConfig("16", "2000"))
	}))
	t.Cleanup(srv.Close)
	s, err := New(DefaultConfig(), []Worker{{Name: "a", Address: srv.Listener.Addr().String()}}, nil, nil, nil)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	s.CountPanics(background.NewMetrics(reg))
	var calls atomic.Int32
	var reported atomic.Int32
	s.ReportCapacity(16, func(_, _ string, blocks int) {
		if calls.Add(1) == 1 {
			panic("injected fault")
		}
		reported.Store(int32(blocks))
	})
	ctx := context.Background()
	s.ScrapeAll(ctx)
	require.Equal(t, 1.0, backgroundtest.Panics(t, reg, background.LoopScrape))
	require.Zero(t, reported.Load())

	s.ScrapeAll(ctx) // the same page
	assert.Equal(t, int32(2000), reported.Load(), "the capacity the panicking report did not give is given now")
	assert.Equal(t, int32(2), calls.Load())
	s.ScrapeAll(ctx)
	assert.Equal(t, int32(2), calls.Load(), "and once given, not again")
}
