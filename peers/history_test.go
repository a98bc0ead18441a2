package peers

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/scoring"
)

// TestReportCarriesEachWorkersPrefillHistory: a report carries each worker's H(w) as
// of its last booking there, rounded to a token, how long before the report that was,
// and that booking's half-life, also for a worker with nothing booked now; a history
// decayed under half a token is left out.
func TestReportCarriesEachWorkersPrefillHistory(t *testing.T) {
	now := time.Unix(1000, 0)
	ledger := scoring.NewBookingsResident(0, func() time.Time { return now })
	ledger.BookDecision("done", "", nil, 1000, 30).Release()
	ledger.BookDecision("busy", "", nil, 800, 10)
	ledger.BookDecision("faded", "", nil, 1, 1).Release()
	now = now.Add(30 * time.Second)

	rec := httptest.NewRecorder()
	Handler("r1", ledger, testHandlerOptions(nil)).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, Path, nil))
	r, err := ParseReport(rec.Body)
	require.NoError(t, err)
	assert.Equal(t, []WorkerLoad{
		{Worker: "busy", PrefillTokens: 800, ActiveRequests: 1, PendingRequests: 1, PrefillHistory: 800, PrefillHistoryAgeMs: 30_000, PrefillHistoryHalfLife: 10},
		{Worker: "done", PrefillHistory: 1000, PrefillHistoryAgeMs: 30_000, PrefillHistoryHalfLife: 30},
	}, r.Workers)
}

// TestADecayingHistorySendsNoReport: H decays all the time, but a report is encoded
// (and sent to the watchers) only when the bookings change; the next one carries the
// same history, older.
func TestADecayingHistorySendsNoReport(t *testing.T) {
	now := time.Unix(1000, 0)
	ledger := scoring.NewBookingsResident(0, func() time.Time { return now })
	ledger.BookDecision("w", "", nil, 1000, 30).Release()
	p := &publisher{replica: "r1", ledger: ledger, interval: time.Millisecond}
	first := p.current()
	require.True(t, first.history)

	now = now.Add(30 * time.Second)
	assert.Same(t, first, p.current(), "the same report: nothing to send")

	ledger.BookDecision("other", "", nil, 0, 30).Release()
	next := p.current()
	require.NotSame(t, first, next)
	r, err := parseReport(next.plain)
	require.NoError(t, err)
	assert.Equal(t, []WorkerLoad{{Worker: "w", PrefillHistory: 1000, PrefillHistoryAgeMs: 30_000, PrefillHistoryHalfLife: 30}}, r.Workers)
}

// TestARepeatedReportCarriesItsAge: a line with prefill histories sent a millisecond
// or more after its report was encoded (a heartbeat, a new stream, a plain GET) says
// how old the report is, so that the watcher dates the histories from when they were
// read; a report without histories, or sent at once, is the same bytes for every
// watcher.
func TestARepeatedReportCarriesItsAge(t *testing.T) {
	plain, history := reportOf("r1", nil, nil, map[string]scoring.History{"w": {Tokens: 1000, Age: time.Second, HalfLife: 30}})
	require.True(t, history)
	tests := []struct {
		name    string
		e       *encoded
		wantAge int64 // at least, in ms; 0: the plain bytes
	}{
		{"sent at once", &encoded{plain: plain, history: true, at: time.Now().Add(time.Hour)}, 0},
		{"two seconds later", &encoded{plain: plain, history: true, at: time.Now().Add(-2 * time.Second)}, 2000},
		{"without histories", &encoded{plain: plain, history: false, at: time.Now().Add(-2 * time.Second)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			line := tt.e.line()
			if tt.wantAge == 0 {
				assert.Equal(t, plain, line)
				return
			}
			r, err := parseReport(line)
			require.NoError(t, err)
			assert.GreaterOrEqual(t, r.AgeMs, tt.wantAge)
			assert.Less(t, r.AgeMs, tt.wantAge+time.Minute.Milliseconds())
			assert.Equal(t, []WorkerLoad{{Worker: "w", PrefillHistory: 1000, PrefillHistoryAgeMs: 1000, PrefillHistoryHalfLife: 30}}, r.Workers)
		})
	}

	// And on a watch stream: the heartbeat repeats the report with its age.
	f := newFakeBookings(nil)
	f.histories = map[string]scoring.History{"w": {Tokens: 1000, HalfLife: 30}}
	srv := httptest.NewServer(Handler("r1", f, HandlerOptions{Interval: time.Millisecond, Heartbeat: 50 * time.Millisecond, MaxWatchers: 1}))
	defer stopServer(srv)
	lines := watchLines(t, srv.URL)
	require.True(t, lines.Scan())
	require.True(t, lines.Scan(), "a heartbeat")
	r, err := parseReport(lines.Bytes())
	require.NoError(t, err)
	assert.GreaterOrEqual(t, r.AgeMs, int64(50))
}

// TestPeersHistoryIsDecayedFromItsBooking: the exchange dates a peer's history on its
// own clock, the line's age and the history's before it heard it, decays each
// replica's with the half-life it gave, and gives the ledger their sum as of now. The
// same history heard again (a heartbeat, another report of the replica, a stream
// reopened) keeps its date and is not given again; a report without histories (an
// older replica) or a replica gone silent takes its history away.
func TestPeersHistoryIsDecayedFromItsBooking(t *testing.T) {
	c := &clock{now: time.Unix(1000, 0)}
	e, ledger := newIdleExchange(t, Deps{Now: c.Now})
	report := func(replica string, ageMs int64, workers ...WorkerLoad) Report {
		return Report{Version: Version, Replica: replica, AgeMs: ageMs, Workers: workers}
	}
	hear := func(addr string, r Report) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.hear(addr, r, c.Now())
	}
	p := WorkerLoad{Worker: "w", PrefillHistory: 1000, PrefillHistoryAgeMs: 20_000, PrefillHistoryHalfLife: 30}

	hear("10.0.0.1:9090", report("p", 10_000, p))
	assert.InDelta(t, 500, ledger.getHistories()["w"], 1e-9, "booked 20 s before a report written 10 s before it was heard: one half-life")
	sets := ledger.historySets

	c.advance(30 * time.Second)
	p.ActiveRequests, p.PrefillHistoryAgeMs = 1, 59_500 // a later report, dated 0.5 s off (a transit): were it dated again, it would move
	hear("10.0.0.1:9090", report("p", 0, p))
	assert.Equal(t, sets, ledger.historySets, "the same history again: not given again")

	q := WorkerLoad{Worker: "w", PrefillHistory: 200, PrefillHistoryHalfLife: 10, ActiveRequests: 1}
	hear("10.0.0.2:9090", report("q", 0, q))
	assert.InDelta(t, 250+200, ledger.getHistories()["w"], 1e-9, "p's, two of its half-lives on, and q's, summed")

	c.advance(10 * time.Second)
	hear("10.0.0.1:9090", report("p", 0, WorkerLoad{Worker: "w", ActiveRequests: 1}))
	assert.InDelta(t, 100, ledger.getHistories()["w"], 1e-9, "p reports no history now (an older version): q's alone, one of its half-lives on")

	c.advance(e.cfg.StaleAfter + time.Millisecond)
	hear("10.0.0.1:9090", report("p", 0))
	e.mu.Lock()
	e.expire(c.Now())
	e.mu.Unlock()
	assert.Empty(t, ledger.getHistories(), "q went silent: its history goes with it")

	hear("10.0.0.2:9090", report("q", 0, q))
	require.NotEmpty(t, ledger.getHistories())
	e.withdraw()
	assert.Empty(t, ledger.getHistories(), "withdrawn when the exchange ends")
}

// TestHostileHistoriesAreRefused: what a peer sends of its prefill history is checked
// before it reaches a cost: a negative, fractional, non-numeric or huge history, a
// history without a usable half-life, or a negative age drops the report. A report
// without them (an older replica) means no history; an age beyond any reason decays
// the history to nothing.
func TestHostileHistoriesAreRefused(t *testing.T) {
	worker := func(fields string) string {
		return `{"version":1,"replica":"p","workers":[{"worker":"w","active_requests":1` + fields + `}]}`
	}
	tests := []struct {
		name    string
		line    string
		refused string // in the error; "" accepts
	}{
		{"an older replica's report", worker(``), ""},
		{"a history", worker(`,"prefill_history":1000,"prefill_history_half_life":30`), ""},
		{"a half-life without a history is not read", worker(`,"prefill_history_half_life":-1`), ""},
		{"negative", worker(`,"prefill_history":-1,"prefill_history_half_life":30`), "prefill_history"},
		{"huge", worker(`,"prefill_history":4294967296,"prefill_history_half_life":30`), "prefill_history"},
		{"beyond int64", worker(`,"prefill_history":1e30,"prefill_history_half_life":30`), "prefill_history"},
		{"fractional", worker(`,"prefill_history":1.5,"prefill_history_half_life":30`), "prefill_history"},
		{"NaN", worker(`,"prefill_history":NaN,"prefill_history_half_life":30`), "invalid character"},
		{"infinite, as a string", worker(`,"prefill_history":"Infinity","prefill_history_half_life":30`), "prefill_history"},
		{"no half-life", worker(`,"prefill_history":1000`), "prefill_history_half_life"},
		{"a half-life of 0", worker(`,"prefill_history":1000,"prefill_history_half_life":0`), "prefill_history_half_life"},
		{"a negative half-life", worker(`,"prefill_history":1000,"prefill_history_half_life":-30`), "prefill_history_half_life"},
		{"a half-life beyond the policy's bound", worker(`,"prefill_history":1000,"prefill_history_half_life":1e7`), "prefill_history_half_life"},
		{"an infinite half-life", worker(`,"prefill_history":1000,"prefill_history_half_life":1e400`), "prefill_history_half_life"},
		{"a negative age of the history", worker(`,"prefill_history":1000,"prefill_history_age_ms":-1,"prefill_history_half_life":30`), "prefill_history_age_ms"},
		{"a negative age of the report", `{"version":1,"replica":"p","age_ms":-5,"workers":[]}`, "age_ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseReport([]byte(tt.line))
			if tt.refused == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.refused)
		})
	}

	// The largest age a report can give decays the history to nothing, without
	// overflowing the clock.
	c := &clock{now: time.Unix(1000, 0)}
	e, ledger := newIdleExchange(t, Deps{Now: c.Now})
	r, err := parseReport([]byte(fmt.Sprintf(`{"version":1,"replica":"p","age_ms":%[1]d,"workers":[{"worker":"w","prefill_history":2147483648,"prefill_history_age_ms":%[1]d,"prefill_history_half_life":1000000}]}`, int64(math.MaxInt64))))
	require.NoError(t, err)
	e.mu.Lock()
	e.hear("10.0.0.1:9090", r, c.Now())
	e.mu.Unlock()
	assert.Empty(t, ledger.getHistories())
}

// TestAPeersHistoryReachesTheCost: end to end between two ledgers, one replica's
// booking on a worker reaches the other's candidates as PeerPrefillHistory, and its
// cost charges it with ω, as if it had booked it itself.
func TestAPeersHistoryReachesTheCost(t *testing.T) {
	sender := scoring.NewBookings()
	sender.BookDecision("a", "", nil, 1600, 30).Release()
	srv := httptest.NewServer(Handler("p", sender, HandlerOptions{Interval: time.Millisecond, Heartbeat: Heartbeat, MaxWatchers: 1}))
	defer stopServer(srv)

	receiver := scoring.NewBookings()
	cfg := DefaultConfig()
	cfg.Addresses = []string{strings.TrimPrefix(srv.URL, "http://")}
	e, err := New(cfg, Deps{Ledger: receiver, Replica: "me"})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()

	params := scoring.DynamoParams()
	params.PrefillHistoryWeight = 1
	charge := func() float64 { // ω·H(a)/bs on the receiver, in blocks of 16
		c := []scoring.Candidate{{Worker: "a"}}
		receiver.Fill(c, nil, "")
		return params.Cost(&scoring.Request{BlockSize: 16}, c[0]).History
	}
	// 1,600 tokens are 100 blocks, decayed by the test's own pace (30 s half-life).
	require.Eventually(t, func() bool { return charge() > 99 }, waitFor, pollAt)
	assert.LessOrEqual(t, charge(), 100.0)

	sender.BookDecision("a", "", nil, 1600, 30).Release()
	require.Eventually(t, func() bool { return charge() > 199 }, waitFor, pollAt, "the next booking's report")

	cancel()
	<-done
	assert.Zero(t, charge(), "withdrawn when the exchange ends")
}
