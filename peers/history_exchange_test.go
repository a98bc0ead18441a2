package peers

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/scoring"
)

// historyPair runs a sender replica ("p", a real scoring.Bookings served over HTTP) and a
// receiver (a real scoring.Bookings fed by an Exchange watching p), both on clk.
func historyPair(t *testing.T, clk *clock) (sender, receiver *scoring.Bookings) {
	t.Helper()
	sender = scoring.NewBookingsResident(0, clk.Now)
	srv := startHistoryServer(t, sender)
	receiver = scoring.NewBookingsResident(0, clk.Now)
	cfg := DefaultConfig()
	cfg.StaleAfter = time.Hour // the fake clock jumps; p never goes stale here
	cfg.Addresses = []string{strings.TrimPrefix(srv, "http://")}
	e, err := New(cfg, Deps{Ledger: receiver, Replica: "me", Now: clk.Now})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return sender, receiver
}

func startHistoryServer(t *testing.T, ledger Ledger) string {
	t.Helper()
	srv := httptest.NewServer(Handler("p", ledger, HandlerOptions{Interval: time.Millisecond, Heartbeat: Heartbeat, MaxWatchers: 2}))
	t.Cleanup(func() { stopServer(srv) })
	return srv.URL
}

// historySeen is the receiver's view of worker a: the active requests (its own and the
// peers') and H(a) as the cost sees it with ω = 1 at a 30 s half-life.
func historySeen(receiver *scoring.Bookings) (active int, h float64) {
	c := []scoring.Candidate{{Worker: "a"}}
	receiver.Fill(c, nil, "")
	p := scoring.DynamoParams()
	p.PrefillHistoryWeight, p.PrefillHistoryHalfLife = 1, 30
	return c[0].ActiveRequests, p.Cost(&scoring.Request{BlockSize: 16}, c[0]).RecentPrefill
}

// TestANewBookingWithTheSameRoundedHistoryIsDatedAnew: the watcher took "the same
// tokens with the same half-life" for the same history and kept its first date
// (sums.countHistories). But a later booking can leave H at the same value: 1,000
// tokens booked, 30 s (one half-life) later 500 more: H = 500 + 500 = 1,000 again, as
// of the second booking. The receiver kept dating it from the first booking and
// charged 500 where the sender says 1,000; a repeated history now keeps its date only
// if the new line dates it within 1 s of it.
func TestANewBookingWithTheSameRoundedHistoryIsDatedAnew(t *testing.T) {
	clk := &clock{now: time.Unix(1_000_000, 0)}
	sender, receiver := historyPair(t, clk)

	sender.BookDecision("a", "", nil, 1000, 30) // kept running: N counts the reports heard
	require.Eventually(t, func() bool { n, _ := historySeen(receiver); return n == 1 }, waitFor, pollAt)
	_, h := historySeen(receiver)
	require.InDelta(t, 1000, h, 1)

	clk.advance(30 * time.Second)
	sender.BookDecision("a", "", nil, 500, 30)
	require.InDelta(t, 1000, sender.PrefillHistory("a", 30), 1e-6, "the sender's H: 1,000 as of now")
	require.Eventually(t, func() bool { n, _ := historySeen(receiver); return n == 2 }, waitFor, pollAt, "the second booking's report heard")
	_, h = historySeen(receiver)
	assert.InDelta(t, 1000, h, 1, "the receiver's H of the peer's bookings")
}

// TestSteadyTrafficsHistoryHoldsAtThePeers: a worker given the same uncached prompt
// every 10 s (1,000 tokens, 30 s half-life) converges to H = 1000/(1-2^(-1/3)) = 4,847
// tokens at each booking, rounded the same every time. Every report then carries the
// same prefill_history with age 0, which the watcher took for the one it heard first:
// the peer's H decayed to nothing at the receiver while the sender's stayed at 4,847.
func TestSteadyTrafficsHistoryHoldsAtThePeers(t *testing.T) {
	clk := &clock{now: time.Unix(1_000_000, 0)}
	sender, receiver := historyPair(t, clk)
	for n := 1; n <= 120; n++ {
		if n > 1 {
			clk.advance(10 * time.Second)
		}
		sender.BookDecision("a", "", nil, 1000, 30) // kept running: N counts the reports heard
		require.Eventually(t, func() bool { got, _ := historySeen(receiver); return got == n }, waitFor, pollAt, "booking %d's report", n)
	}
	own := sender.PrefillHistory("a", 30)
	require.InDelta(t, 4847, own, 1, "the sender's steady H")
	_, h := historySeen(receiver)
	assert.InDelta(t, own, h, 5, "the receiver's H of the peer's steady traffic")
}

// TestAReportKeepsWhatPeersAcceptBusiestFirst: a report past MaxReportWorkers entries
// or MaxReportBytes is refused whole by every peer, and with it every count in it. Since
// reports carry histories, every worker booked in the last minutes has an entry, busy
// or not: a replica that had booked more than MaxReportWorkers workers wrote reports no
// peer accepted, even of its one busy worker. Now the busy workers go first, then the
// largest histories, within both bounds.
func TestAReportKeepsWhatPeersAcceptBusiestFirst(t *testing.T) {
	longName := func(i int) string { return fmt.Sprintf("%s-%05d", strings.Repeat("w", 400), i) }
	shortName := func(i int) string { return fmt.Sprintf("vllm-%05d", i) }
	tests := []struct {
		name       string
		workerName func(int) string
		idle, busy int // workers booked and released a minute ago; workers running a request
		wantBusy   int // busy workers in the report
		wantIdle   int // idle workers (a history alone) in the report, at least
	}{
		{"more workers booked than a report holds: the busy one and the rest of the room", shortName, MaxReportWorkers, 1, 1, MaxReportWorkers - 1},
		{"more busy workers than a report holds", shortName, 0, MaxReportWorkers + 10, MaxReportWorkers, 0},
		{"long names past the bytes a report holds", longName, 0, 3000, 1800, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Unix(1_000_000, 0)
			ledger := scoring.NewBookingsResident(0, func() time.Time { return now })
			for i := range tt.idle {
				ledger.BookDecision(tt.workerName(i), "", nil, 1000+i, 30).Release()
			}
			now = now.Add(time.Minute)
			for i := range tt.busy {
				ledger.BookDecision(tt.workerName(tt.idle+i), "", nil, 1000, 30)
			}
			rec := httptest.NewRecorder()
			Handler("r1", ledger, testHandlerOptions(nil)).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, Path, nil))
			r, err := ParseReport(rec.Body)
			require.NoError(t, err, "a peer accepts the report")
			busy, idle := 0, 0
			for _, w := range r.Workers {
				if w.ActiveRequests > 0 {
					busy++
				} else {
					idle++
					assert.Positive(t, w.PrefillHistory, "an idle worker is there for its history")
				}
			}
			if tt.wantBusy == tt.busy {
				assert.Equal(t, tt.wantBusy, busy, "every busy worker")
			} else {
				assert.GreaterOrEqual(t, busy, tt.wantBusy, "as many busy workers as fit")
			}
			assert.GreaterOrEqual(t, idle, tt.wantIdle, "the histories fill the rest")
		})
	}
}
