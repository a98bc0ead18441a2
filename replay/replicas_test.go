package replay

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/sim"
)

func TestReplicasShareWhereSessionsAreThroughKVEventsOrSharedBlocks(t *testing.T) {
	// Two replicas, each request to one at random. On the approximate index a replica
	// knows only the blocks of requests it routed, so a turn reaching the other replica
	// finds no holder and sessions move; with KV events every replica's index hears
	// every engine, and with the decisions' blocks exchanged every 10 ms
	// (peers.share_blocks) every replica's index hears every decision: sessions stay
	// as with one replica. Exchanging only the counts does not help.
	tests := []struct {
		name               string
		source             string
		shareInterval      time.Duration
		shareBlocks        bool
		minMoves, maxMoves int
	}{
		{name: "approximate index: each replica knows its own decisions", source: SourceApproximate, minMoves: 10, maxMoves: 176},
		{name: "approximate index, counts exchanged", source: SourceApproximate, shareInterval: 10 * time.Millisecond, minMoves: 10, maxMoves: 176},
		{name: "approximate index, decisions' blocks exchanged", source: SourceApproximate, shareInterval: 10 * time.Millisecond, shareBlocks: true, minMoves: 0, maxMoves: 1},
		{name: "events: every replica hears every engine", source: SourceEvents, minMoves: 0, maxMoves: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := workloadA("kvroute", 1)
			cfg.IndexSource, cfg.Replicas, cfg.ShareInterval, cfg.ShareBlocks = tt.source, 2, tt.shareInterval, tt.shareBlocks
			res, err := Run(cfg, NewSessions(DefaultSessions(), 1))
			require.NoError(t, err)
			require.Equal(t, 192, res.Requests)
			assert.GreaterOrEqual(t, res.MovedTurns, tt.minMoves)
			assert.LessOrEqual(t, res.MovedTurns, tt.maxMoves)
		})
	}
}

func TestARunEndsWithEveryReplicasBookingsReleased(t *testing.T) {
	// A release that reached another replica's ledger, or none, would skew every later
	// decision and go unseen in the results: Run reports a booking left at the end.
	rn := &run{names: []string{"w0"}}
	for range 2 {
		rn.replicas = append(rn.replicas, &replica{bookings: scoring.NewBookings()})
	}
	require.NoError(t, rn.checkReleased())
	left := rn.replicas[1].bookings.Book("w0", []uint64{7}, 64)
	err := rn.checkReleased()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "replica 1: worker w0 still has bookings")
	left.Release()
	require.NoError(t, rn.checkReleased())
}

func TestReplicaConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"negative replicas", func(c *Config) { c.Replicas = -1 }, "replicas: must be ≥ 0"},
		{"negative scrape interval", func(c *Config) { c.ScrapeInterval = -time.Second }, "scrape interval: must be ≥ 0"},
		{"partition with replicas", func(c *Config) { c.Policy, c.Replicas = "partition:0101010101010101", 2 }, "a partition needs one replica"},
		{"negative share interval", func(c *Config) { c.ShareInterval = -time.Second }, "share interval: must be ≥ 0"},
		{"shared bookings with one replica", func(c *Config) { c.SharedBookings = true }, "need at least 2 replicas"},
		{"share interval with one replica", func(c *Config) { c.ShareInterval = time.Second }, "need at least 2 replicas"},
		{"share interval with one ledger", func(c *Config) { c.Replicas, c.SharedBookings, c.ShareInterval = 2, true, time.Second }, "nothing to exchange"},
		{"shared blocks without an exchange", func(c *Config) { c.Replicas, c.ShareBlocks = 2, true }, "share blocks: needs a share interval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := workloadA("kvroute", 1)
			tt.edit(&cfg)
			_, err := Run(cfg, NewSessions(DefaultSessions(), 1))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestSignalsServeTheLastScrape(t *testing.T) {
	engine, err := sim.New(sim.Config{NumGPUBlocks: 64, BlockSize: 16, MaxNumSeqs: 4, MaxBatchedTokens: 256})
	require.NoError(t, err)
	rn := &run{cfg: Config{ScrapeInterval: time.Second}, engines: []*sim.Engine{engine},
		byName: map[string]int{"w0": 0}, scraped: make([]signal, 1)}
	queue := func(id int) {
		require.NoError(t, engine.Add(&sim.Request{ID: id, Prompt: make([]uint32, 32), Output: make([]uint32, 2)}))
	}

	rn.scrapeUntil(0) // the scrape at 0 s sees an empty engine
	queue(1)
	queue(2)
	waiting, _ := rn.Signals("w0")
	assert.Equal(t, 0, waiting, "requests queued after the scrape are not seen until the next one")

	rn.scrapeUntil(999 * time.Millisecond)
	waiting, _ = rn.Signals("w0")
	assert.Equal(t, 0, waiting, "no scrape is due before 1 s")

	rn.scrapeUntil(time.Second)
	waiting, _ = rn.Signals("w0")
	assert.Equal(t, 2, waiting, "the scrape at 1 s sees both")

	rn.cfg.ScrapeInterval, rn.scraped = 0, nil
	queue(3)
	waiting, _ = rn.Signals("w0")
	assert.Equal(t, 3, waiting, "without an interval every decision reads the engine now")
}

func TestScrapesKeepTheirScheduleOverIdleGaps(t *testing.T) {
	// Between events nothing changes, so of the scrapes due since the last event only
	// the latest is read; the next stays on the interval's grid, counted from 0.
	tests := []struct {
		name     string
		interval time.Duration
		at       time.Duration // the event the scrapes are taken before
		next     time.Duration // the next scrape due after it
	}{
		{"an event on a scrape's time reads that scrape", time.Second, 3 * time.Second, 4 * time.Second},
		{"an event between scrapes reads the one before it", time.Second, 2500 * time.Millisecond, 3 * time.Second},
		{"a nanosecond interval over an idle hour is one reading", time.Nanosecond, time.Hour, time.Hour + time.Nanosecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			engine, err := sim.New(sim.Config{NumGPUBlocks: 64, BlockSize: 16, MaxNumSeqs: 4, MaxBatchedTokens: 256})
			require.NoError(t, err)
			rn := &run{cfg: Config{ScrapeInterval: tt.interval}, engines: []*sim.Engine{engine},
				byName: map[string]int{"w0": 0}, scraped: make([]signal, 1)}
			rn.scrapeUntil(0)
			require.NoError(t, engine.Add(&sim.Request{ID: 1, Prompt: make([]uint32, 32), Output: make([]uint32, 2)}))

			rn.scrapeUntil(tt.at)
			waiting, _ := rn.Signals("w0")
			assert.Equal(t, 1, waiting, "a scrape due by the event reads the engine")
			assert.Equal(t, tt.next, rn.nextScrape)
		})
	}
}

func TestSharedBookingsGiveReplicasOneRoutersTail(t *testing.T) {
	// Two replicas behind one system prompt, 4 batch slots per worker: each replica's
	// queue term sees only the requests it queued, so holders queue more than with one
	// router. One ledger for both (what sharing bookings would buy) brings the tail back.
	run := func(replicas int, shared bool) Result {
		res, err := Run(Config{Workers: 4, Engine: sim.Config{NumGPUBlocks: 16384, BlockSize: 64, MaxNumSeqs: 4, MaxBatchedTokens: 8192},
			Policy: "kvroute", Seed: 1, IndexSource: SourceEvents, Model: "m", Replicas: replicas, SharedBookings: shared},
			NewSessions(DefaultSharedPrefix(), 1))
		require.NoError(t, err)
		return res
	}
	one, split, shared := run(1, false), run(2, false), run(2, true)
	assert.Greater(t, split.TTFTP95ms, 1.2*one.TTFTP95ms, "split bookings lengthen the tail")
	assert.Less(t, shared.TTFTP95ms, 1.1*one.TTFTP95ms, "one ledger brings it back")

	// Telling each other their counts every 50 ms gets most of the way.
	res, err := Run(Config{Workers: 4, Engine: sim.Config{NumGPUBlocks: 16384, BlockSize: 64, MaxNumSeqs: 4, MaxBatchedTokens: 8192},
		Policy: "kvroute", Seed: 1, IndexSource: SourceEvents, Model: "m", Replicas: 2, ShareInterval: 50 * time.Millisecond},
		NewSessions(DefaultSharedPrefix(), 1))
	require.NoError(t, err)
	assert.Less(t, res.TTFTP95ms, 0.85*split.TTFTP95ms, "exchanged counts shorten the tail")
}

func TestEachReplicaLearnsTheOtherReplicasCountsOnTheExchangeGrid(t *testing.T) {
	// Three replicas each book on w0; an exchange gives each the sum of the two OTHER
	// replicas' P, N and W (never its own again), only when one is due on the grid of
	// ShareInterval from 0, and reads the ledgers at that time.
	rn := &run{cfg: Config{ShareInterval: 100 * time.Millisecond}, names: []string{"w0", "w1"}}
	for range 3 {
		rn.replicas = append(rn.replicas, &replica{bookings: scoring.NewBookings()})
	}
	book := func(r, tokens int) *scoring.Booking {
		return rn.replicas[r].bookings.Book("w0", []uint64{uint64(r)}, tokens)
	}
	seen := func(r int) [3]int { // P, N, W replica r's decisions see on w0
		c := []scoring.Candidate{{Worker: "w0"}}
		rn.replicas[r].bookings.Fill(c, nil, "")
		return [3]int{c[0].PrefillTokens, c[0].ActiveRequests, c[0].PendingRequests}
	}
	book(0, 10)
	book(1, 200)
	book(1, 300).PrefillDone()
	rn.shareUntil(0)
	assert.Equal(t, [3]int{10 + 200, 3, 2}, seen(0), "replica 0: its own plus replica 1's")
	assert.Equal(t, [3]int{500 - 300 + 10, 3, 2}, seen(1), "replica 1: its own plus replica 0's")
	assert.Equal(t, [3]int{210, 3, 2}, seen(2), "replica 2: the two others'")
	assert.Equal(t, 100*time.Millisecond, rn.nextShare)

	late := book(2, 4000)
	rn.shareUntil(99 * time.Millisecond)
	assert.Equal(t, [3]int{210, 3, 2}, seen(0), "no exchange due before 100 ms")
	rn.shareUntil(350 * time.Millisecond)
	assert.Equal(t, [3]int{4210, 4, 3}, seen(0), "the exchange due at 300 ms")
	assert.Equal(t, 400*time.Millisecond, rn.nextShare)

	late.Release()
	rn.shareUntil(400 * time.Millisecond)
	assert.Equal(t, [3]int{210, 3, 2}, seen(0), "a release reaches the others at the next exchange")
	assert.Equal(t, [3]int{210, 3, 2}, seen(2))
	assert.Equal(t, scoring.Load{}, rn.replicas[2].bookings.Load("w0"), "the exchange leaves each ledger's own load alone")
	c := []scoring.Candidate{{Worker: "w1"}}
	rn.replicas[0].bookings.Fill(c, nil, "")
	assert.Zero(t, c[0].ActiveRequests, "a worker no replica booked on gets no peer load")
}

// TestBypassedSessionsRunPastTheRouter: with a bypass share, whole sessions (the same
// ones for every policy) go to the workers round-robin; the results count the routed
// requests only, and a share outside [0, 1) is refused.
func TestBypassedSessionsRunPastTheRouter(t *testing.T) {
	cfg := Config{Workers: 2, Engine: sim.Config{NumGPUBlocks: 512, BlockSize: 64, MaxNumSeqs: 8, MaxBatchedTokens: 8192},
		Policy: "kvroute", Seed: 1, Model: "m", IndexSource: SourceApproximate, BypassShare: 0.5}
	sessions := DefaultSessions()
	bypassed := 0
	for s := range sessions.Sessions {
		if (&run{cfg: cfg}).bypasses(&Req{Session: s}) {
			bypassed++
		}
	}
	require.Greater(t, bypassed, 0)
	require.Less(t, bypassed, sessions.Sessions)
	res, err := Run(cfg, NewSessions(sessions, 1))
	require.NoError(t, err)
	assert.Equal(t, (sessions.Sessions-bypassed)*sessions.Turns, res.Requests)

	for _, share := range []float64{-0.1, 1, math.NaN()} {
		cfg.BypassShare = share
		_, err := Run(cfg, NewSessions(sessions, 1))
		assert.ErrorContains(t, err, "bypass share: must be in [0, 1)")
	}
}

// TestEnginesUnseenRequestsFillBatchSlots: with UnseenRequests each ledger learns what
// the engines run beyond the bookings. Nothing bypassing one replica, the counts agree
// and the run is the same; with half the sessions past kvroute on 4 slots, their
// requests take slots the queue term now sees, and the tail shortens
// (seed 1: 67.5 → 46.2 ms; docs/BENCHMARKS.md "Traffic that bypasses kvroute").
func TestEnginesUnseenRequestsFillBatchSlots(t *testing.T) {
	run := func(bypass float64, unseen bool) Result {
		res, err := Run(Config{Workers: 4, Engine: sim.Config{NumGPUBlocks: 16384, BlockSize: 64, MaxNumSeqs: 4, MaxBatchedTokens: 8192},
			Policy: "kvroute", Seed: 1, IndexSource: SourceApproximate, Model: "m", ScrapeInterval: time.Second,
			BypassShare: bypass, UnseenRequests: unseen},
			NewSessions(DefaultSharedPrefix(), 1))
		require.NoError(t, err)
		return res
	}
	assert.Equal(t, run(0, false), run(0, true), "nothing unseen: the same run")
	off, on := run(0.5, false), run(0.5, true)
	assert.NotEqual(t, off, on)
	assert.Less(t, on.TTFTP95ms, off.TTFTP95ms, "half the sessions past kvroute: their slots are seen")
}

// TestEachReplicaLearnsTheOtherReplicasPrefillHistory: an exchange also gives each
// replica the others' prefill history per worker, summed, as of the exchange, which
// it then decays on the shared clock; its own stays its own.
func TestEachReplicaLearnsTheOtherReplicasPrefillHistory(t *testing.T) {
	rn := &run{cfg: Config{ShareInterval: 100 * time.Millisecond}, names: []string{"w0", "w1"}}
	clock := func() time.Time { return epoch.Add(rn.now) }
	for range 3 {
		rn.replicas = append(rn.replicas, &replica{bookings: scoring.NewBookingsResident(0, clock)})
	}
	rn.replicas[0].bookings.BookDecision("w0", "", nil, 1000, 30).Release()
	rn.replicas[1].bookings.BookDecision("w0", "", nil, 600, 30).Release()
	seen := func(r int) (own, peers float64) { // H(w0) replica r's decisions see, at rn.now
		c := []scoring.Candidate{{Worker: "w0"}}
		rn.replicas[r].bookings.Fill(c, nil, "")
		h := scoring.History{HalfLife: 30}
		h.Tokens = c[0].PrefillHistory
		own = h.After(c[0].PrefillHistoryAge)
		h.Tokens = c[0].PeerPrefillHistory
		return own, h.After(c[0].PeerPrefillHistoryAge)
	}
	_, peers := seen(0)
	assert.Zero(t, peers, "nothing before the first exchange")

	rn.now = 30 * time.Second
	rn.shareUntil(rn.now)
	for r, want := range [][2]float64{{500, 300}, {300, 500}, {0, 800}} {
		own, peers := seen(r)
		assert.InDelta(t, want[0], own, 1e-9, "replica %d's own", r)
		assert.InDelta(t, want[1], peers, 1e-9, "replica %d's peers', one half-life on", r)
	}
	rn.now = 60 * time.Second
	_, peers = seen(2)
	assert.InDelta(t, 400, peers, 1e-9, "decayed between exchanges")
	c := []scoring.Candidate{{Worker: "w1"}}
	rn.replicas[0].bookings.Fill(c, nil, "")
	assert.Zero(t, c[0].PeerPrefillHistory, "a worker no replica booked on gets none")
}
