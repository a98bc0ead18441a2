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

// h77Pair runs a sender replica ("p", a real scoring.Bookings served over HTTP) and a
// receiver (a real scoring.Bookings fed by an Exchange watching p), both on clk.
func h77Pair(t *testing.T, clk *clock) (sender, receiver *scoring.Bookings) {
	t.Helper()
	sender = scoring.NewBookingsResident(0, clk.Now)
	srv := startH77Server(t, sender)
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

func startH77Server(t *testing.T, ledger Ledger) string {
	t.Helper()
	srv := httptest.NewServer(Handler("p", ledger, HandlerOptions{Interval: time.Millisecond, Heartbeat: Heartbeat, MaxWatchers: 2}))
	t.Cleanup(func() { stopServer(srv) })
	return srv.URL
}

// h77Seen is the receiver's view of worker a: the active requests (its own and the
// peers') and H(a) as the cost sees it with ω = 1 at a 30 s half-life.
func h77Seen(receiver *scoring.Bookings) (active int, h float64) {
	c := []scoring.Candidate{{Worker: "a"}}
	receiver.Fill(c, nil, "")
	p := scoring.DynamoParams()
	p.PrefillHistoryWeight, p.PrefillHistoryHalfLife = 1, 30
	return c[0].ActiveRequests, p.Cost(&scoring.Request{BlockSize: 16}, c[0]).RecentPrefill
}

// TestH77ANewBookingWithTheSameRoundedHistoryKeepsTheOldDate: the watcher takes "the
// same tokens with the same half-life" for the same history and keeps its first date
// (sums.countHistories). But a later booking can leave H at the same value: 1,000
// tokens booked, 30 s (one half-life) later 500 more: H = 500 + 500 = 1,000 again, as
// of the second booking. The receiver keeps dating it from the first booking and
// charges 500 where the sender (and the receiver's own ledger, had it booked both)
// says 1,000.
func TestH77ANewBookingWithTheSameRoundedHistoryKeepsTheOldDate(t *testing.T) {
	clk := &clock{now: time.Unix(1_000_000, 0)}
	sender, receiver := h77Pair(t, clk)

	sender.BookDecision("a", "", nil, 1000, 30) // kept running: N counts the reports heard
	require.Eventually(t, func() bool { n, _ := h77Seen(receiver); return n == 1 }, waitFor, pollAt)
	_, h := h77Seen(receiver)
	require.InDelta(t, 1000, h, 1)

	clk.advance(30 * time.Second)
	sender.BookDecision("a", "", nil, 500, 30)
	require.InDelta(t, 1000, sender.PrefillHistory("a", 30), 1e-6, "the sender's H: 1,000 as of now")
	require.Eventually(t, func() bool { n, _ := h77Seen(receiver); return n == 2 }, waitFor, pollAt, "the second booking's report heard")
	_, h = h77Seen(receiver)
	assert.InDelta(t, 1000, h, 1, "the receiver's H of the peer's bookings")
}

// TestH77SteadyTrafficsHistoryDecaysAwayAtThePeers: a worker given the same uncached
// prompt every 10 s (1,000 tokens, 30 s half-life) converges to H = 1000/(1-2^(-1/3)) =
// 4,847 tokens at each booking, rounded the same every time. From then on every report
// carries the same prefill_history with age 0, which the watcher takes for the one it
// heard first: the peer's H there decays to nothing at the receiver while the sender's
// stays at 4,847.
func TestH77SteadyTrafficsHistoryDecaysAwayAtThePeers(t *testing.T) {
	clk := &clock{now: time.Unix(1_000_000, 0)}
	sender, receiver := h77Pair(t, clk)
	for n := 1; n <= 120; n++ {
		if n > 1 {
			clk.advance(10 * time.Second)
		}
		sender.BookDecision("a", "", nil, 1000, 30) // kept running: N counts the reports heard
		require.Eventually(t, func() bool { got, _ := h77Seen(receiver); return got == n }, waitFor, pollAt, "booking %d's report", n)
	}
	own := sender.PrefillHistory("a", 30)
	require.InDelta(t, 4847, own, 1, "the sender's steady H")
	_, h := h77Seen(receiver)
	assert.InDelta(t, own, h, 5, "the receiver's H of the peer's steady traffic")
}

// TestH77IdleWorkersHistoriesPushAReportPastWhatPeersAccept: before the histories a
// report listed the busy workers only; now it also lists every worker booked within
// the last ~18 half-lives (about 9 minutes at 30 s), idle or not. A replica of a fleet
// of more than MaxReportWorkers workers that it booked in the last minutes, of which one
// is busy, writes a report every peer refuses (and drops the stream over), so its one
// busy worker's P, N and W reach no peer either, whatever ω (0 by default).
func TestH77IdleWorkersHistoriesPushAReportPastWhatPeersAccept(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	ledger := scoring.NewBookingsResident(0, func() time.Time { return now })
	for i := range MaxReportWorkers + 1 {
		ledger.BookDecision(fmt.Sprintf("vllm-%05d", i), "", nil, 1000, 30).Release()
	}
	ledger.BookDecision("vllm-00000", "", nil, 1000, 30) // one busy worker
	now = now.Add(time.Minute)

	rec := httptest.NewRecorder()
	Handler("r1", ledger, testHandlerOptions(nil)).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, Path, nil))
	r, err := ParseReport(rec.Body)
	require.NoError(t, err, "the report a peer reads of one busy worker")
	assert.Equal(t, int64(1), r.Workers[0].ActiveRequests)
}
