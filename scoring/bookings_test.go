package scoring

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBookingLifecycle(t *testing.T) {
	b := NewBookings()
	first := b.Book("w", []uint64{1, 2, 3}, 192)
	second := b.Book("w", []uint64{1, 2, 4}, 64)
	assert.Equal(t, Load{PrefillTokens: 256, ActiveBlocks: 4, ActiveRequests: 2, PendingRequests: 2}, b.Load("w"), "shared prefixes count once")

	first.PrefillDone()
	first.PrefillDone()
	assert.Equal(t, Load{PrefillTokens: 64, ActiveBlocks: 4, ActiveRequests: 2, PendingRequests: 1}, b.Load("w"), "prefill ends once, blocks stay until release")

	assert.True(t, first.Release())
	assert.False(t, first.Release(), "a second release does nothing")
	first.PrefillDone()
	assert.Equal(t, Load{PrefillTokens: 64, ActiveBlocks: 3, ActiveRequests: 1, PendingRequests: 1}, b.Load("w"))

	assert.True(t, second.Release(), "release without a first token also ends the prefill share")
	assert.Equal(t, Load{}, b.Load("w"))
}

func TestABookingMovesWholeToTheWorkerThatServesIt(t *testing.T) {
	tests := []struct {
		name         string
		prefillDone  bool
		wantFallback Load
	}{
		{"before its first token: its new prefill share goes with it", false,
			Load{PrefillTokens: 40, ActiveBlocks: 2, ActiveRequests: 1, PendingRequests: 1}},
		{"after its first token: no prefill share", true,
			Load{ActiveBlocks: 2, ActiveRequests: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Unix(1000, 0)
			b := NewBookingsResident(0, func() time.Time { return now })
			other := b.Book("chosen", []uint64{1}, 7) // another request, which stays
			k := b.BookAdapter("chosen", "sql", []uint64{1, 2}, 128)
			if tt.prefillDone {
				k.PrefillDone()
			}
			now = now.Add(30 * time.Second) // one default half-life
			before := b.Version()
			require.True(t, k.MoveTo("fallback", 40))
			half := float64(DefaultPrefillHistoryHalfLife)
			assert.InDelta(t, 3.5, b.PrefillHistory("chosen", half), 1e-9, "the chosen worker's prefill history keeps the other request's, decayed")
			assert.InDelta(t, 40, b.PrefillHistory("fallback", half), 1e-9, "the fallback computed the prompt")
			assert.Greater(t, b.Version(), before, "peers hear of the move")
			assert.Equal(t, Load{PrefillTokens: 7, ActiveBlocks: 1, ActiveRequests: 1, PendingRequests: 1}, b.Load("chosen"), "only the other request stays")
			assert.Equal(t, tt.wantFallback, b.Load("fallback"))
			_, adapters := b.LoadsWithAdapters()
			assert.Equal(t, map[string]map[string]int{"fallback": {"sql": 1}}, adapters, "the adapter runs where the request does")
			assert.False(t, k.MoveTo("fallback", 40), "already there")

			k.PrefillDone()
			assert.True(t, k.Release(), "the moved booking is released once, where it is")
			assert.False(t, k.Release())
			assert.False(t, k.MoveTo("chosen", 0), "a released booking does not move")
			assert.Equal(t, Load{}, b.Load("fallback"))
			other.Release()
			assert.Equal(t, Load{}, b.Load("chosen"))
		})
	}
}

// The request never ran on the worker it moved off (the data plane could not reach
// it): its adapter is not resident there for lora_residency, which would pull the
// adapter's next requests to that worker. An adapter that did run there stays resident
// from when its last request there ended, as it would have without the moved booking.
func TestAMovedBookingLeavesNoAdapterResidencyWhereItNeverRan(t *testing.T) {
	now := time.Unix(1000, 0)
	b := NewBookingsResident(time.Minute, func() time.Time { return now })
	resident := func() map[string]map[string]int { _, adapters := b.LoadsWithAdapters(); return adapters }

	k := b.BookAdapter("chosen", "sql", []uint64{1}, 10)
	require.True(t, k.MoveTo("fallback", 10))
	assert.Equal(t, map[string]map[string]int{"fallback": {"sql": 1}}, resident(), "never resident on chosen")
	now = now.Add(time.Second)
	k.Release()
	assert.Equal(t, map[string]map[string]int{"fallback": {"sql": 0}}, resident(), "resident where it ran, after its end")

	// The adapter ran on chosen: one request ended at t1, another (booked while the moved
	// one was) at t2; the moved one leaves the residency as those two made it.
	ran := b.BookAdapter("chosen", "sql", []uint64{2}, 10)
	now = now.Add(time.Second)
	ran.Release()
	also := b.BookAdapter("chosen", "sql", []uint64{3}, 10)
	moved := b.BookAdapter("chosen", "sql", []uint64{4}, 10)
	now = now.Add(time.Second)
	also.Release() // t2: moved still booked there
	t2 := now
	now = now.Add(time.Second)
	require.True(t, moved.MoveTo("fallback", 10))
	assert.Equal(t, 0, resident()["chosen"]["sql"], "resident, no request booked")
	now = t2.Add(time.Minute - time.Millisecond)
	assert.Contains(t, resident(), "chosen", "resident for lora_residency after t2")
	now = t2.Add(time.Minute)
	assert.NotContains(t, resident(), "chosen", "not after: the move did not end a request there")
	moved.Release()

	// On a clock at the zero time (a simulation's), an adapter never ended there has no
	// end to count residency from.
	now = time.Time{}
	k = b.BookAdapter("zero", "sql", []uint64{5}, 10)
	require.True(t, k.MoveTo("fallback", 10))
	assert.NotContains(t, resident(), "zero")
	k.Release()
}

func TestFillComputesNewBlocksFromTheLeadingActiveRun(t *testing.T) {
	b := NewBookings()
	b.Book("w", []uint64{1, 2, 3}, 0)
	cands := []Candidate{{Worker: "w"}, {Worker: "idle"}}
	b.Fill(cands, []uint64{1, 2, 9, 3}, "")
	assert.Equal(t, Candidate{Worker: "w", ActiveBlocks: 3, ActiveRequests: 1, PendingRequests: 1, NewBlocks: 2}, cands[0])
	assert.Equal(t, Candidate{Worker: "idle", NewBlocks: 4}, cands[1])
}

func TestFillCountsTheLeadingRunThatTwoActiveRequestsShare(t *testing.T) {
	b := NewBookings()
	b.Book("w", []uint64{1, 2, 3, 5}, 0)
	b.Book("w", []uint64{1, 2, 4}, 0).PrefillDone()
	b.Book("solo", []uint64{1, 2, 3}, 0)
	tests := []struct {
		name       string
		blocks     []uint64
		wantShared []int // per candidate: w, solo
		wantNew    []int
	}{
		{"a prompt behind the shared prefix", []uint64{1, 2, 3, 9}, []int{2, 0}, []int{1, 1}},
		{"the run stops at the first block one request holds", []uint64{1, 3, 2}, []int{1, 0}, []int{0, 0}},
		{"nothing shared", []uint64{7, 1, 2}, []int{0, 0}, []int{3, 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cands := []Candidate{{Worker: "w"}, {Worker: "solo"}}
			b.Fill(cands, tt.blocks, "")
			assert.Equal(t, tt.wantShared, []int{cands[0].SharedBlocks, cands[1].SharedBlocks})
			assert.Equal(t, tt.wantNew, []int{cands[0].NewBlocks, cands[1].NewBlocks})
			assert.Equal(t, []int{1, 1}, []int{cands[0].PendingRequests, cands[1].PendingRequests}, "one request on each has no first token yet")
		})
	}
}

func TestARemovedWorkerCountsWhatItStillRunsUntilReleased(t *testing.T) {
	b := NewBookings()
	old := b.Book("w", []uint64{1}, 10)
	b.RemoveWorker("w")
	assert.Equal(t, Load{PrefillTokens: 10, ActiveBlocks: 1, ActiveRequests: 1, PendingRequests: 1}, b.Load("w"),
		"a request booked on a removed worker still runs there")
	fresh := b.Book("w", []uint64{2}, 5) // back in the fleet before it finished
	assert.True(t, old.Release())
	assert.Equal(t, Load{PrefillTokens: 5, ActiveBlocks: 1, ActiveRequests: 1, PendingRequests: 1}, b.Load("w"),
		"a worker back in the fleet is not forgotten when its old request ends")
	fresh.Release()
	assert.Equal(t, Load{}, b.Load("w"))
	b.mu.Lock()
	_, kept := b.workers["w"]
	b.mu.Unlock()
	assert.True(t, kept, "a worker in the fleet keeps its entry")

	gone := b.Book("x", []uint64{3}, 1)
	b.RemoveWorker("x")
	gone.PrefillDone()
	gone.Release()
	b.mu.Lock()
	_, kept = b.workers["x"]
	b.mu.Unlock()
	assert.False(t, kept, "a removed worker is forgotten with its last booking")
}

func TestADetachedWorkerStartsAnewWhileItsOldRequestsDrain(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	b := NewBookingsResident(time.Minute, func() time.Time { return now })
	old := b.BookDecision("w", "x", []uint64{1, 2}, 10, 30) // the old engine's, adapter x
	blockedForY := func() float64 {
		c := []Candidate{{Worker: "w", MaxLoRAs: 1}}
		b.Fill(c, nil, "y")
		return c[0].LoRABlocked
	}
	require.Equal(t, 2.0, blockedForY(), "x holds w's one adapter slot: y waits for its request")
	b.DetachWorker("w") // another engine under w's name
	assert.Equal(t, Load{}, b.Load("w"), "the new engine runs none of the old one's requests")
	fresh := b.Book("w", []uint64{3}, 5)
	assert.True(t, old.Release(), "the old request's release drains the old engine's load")
	assert.Equal(t, Load{PrefillTokens: 5, ActiveBlocks: 1, ActiveRequests: 1, PendingRequests: 1}, b.Load("w"),
		"and leaves the new engine's as it was")
	assert.Equal(t, 1.0, blockedForY(), "x, resident on the old engine for a minute, holds no slot on the new one: y takes the free one")
	fresh.Release()
	assert.Equal(t, Load{}, b.Load("w"))
	assert.InDelta(t, 5, b.PrefillHistory("w", 30), 1e-9, "the new engine's prefill history is its own request's, not the old engine's")
}

func TestACancelledBookingLeavesNoPrefillHistory(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	b := NewBookingsResident(0, func() time.Time { return now })
	ran := b.BookDecision("w", "", []uint64{1}, 100, 30)
	ran.Release()
	never := b.BookDecision("w", "", []uint64{2}, 40, 30)
	now = now.Add(30 * time.Second)
	assert.InDelta(t, 70, b.PrefillHistory("w", 30), 1e-9, "both bookings, one half-life later")
	assert.True(t, never.Cancel())
	assert.Equal(t, Load{}, b.Load("w"), "a cancelled booking is released")
	assert.InDelta(t, 50, b.PrefillHistory("w", 30), 1e-9, "and its prefill, which no engine computed, leaves the history")
	assert.False(t, never.Cancel(), "once")
	assert.False(t, never.Release())
}

func TestBookingsUnderConcurrentUseReturnToZero(t *testing.T) {
	b := NewBookings()
	var wg sync.WaitGroup
	var releases sync.Map
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				worker := []string{"a", "b", "c"}[(g+i)%3]
				k := b.Book(worker, []uint64{uint64(i % 5), uint64(100 + i%7)}, 64)
				var inner sync.WaitGroup
				// First token, completion and a racing cancel all arrive at once.
				inner.Go(k.PrefillDone)
				for range 2 {
					inner.Go(func() {
						if k.Release() {
							n, _ := releases.LoadOrStore(k, new(int))
							*n.(*int)++
						}
					})
				}
				inner.Wait()
				l := b.Load(worker)
				if l.PrefillTokens < 0 || l.ActiveRequests < 0 || l.PendingRequests < 0 {
					t.Errorf("negative load %+v", l)
				}
			}
		})
	}
	wg.Wait()
	for _, w := range []string{"a", "b", "c"} {
		assert.Equal(t, Load{}, b.Load(w), w)
	}
	count := 0
	releases.Range(func(_, v any) bool {
		require.Equal(t, 1, *v.(*int), "each booking released exactly once")
		count++
		return true
	})
	assert.Equal(t, 8*500, count)
}

func TestPeerLoadJoinsTheCountsButNotTheBlocks(t *testing.T) {
	b := NewBookings()
	b.Book("w", []uint64{1, 2}, 100)
	tests := []struct {
		name string
		peer Load
		want Candidate // P, D, N, W after Fill
	}{
		{"no peer load", Load{}, Candidate{PrefillTokens: 100, ActiveBlocks: 2, ActiveRequests: 1, PendingRequests: 1}},
		{"peers add P, N and W", Load{PrefillTokens: 50, ActiveBlocks: 7, ActiveRequests: 3, PendingRequests: 2},
			Candidate{PrefillTokens: 150, ActiveBlocks: 2, ActiveRequests: 4, PendingRequests: 3}},
		{"negative counts are 0", Load{PrefillTokens: -50, ActiveRequests: -3, PendingRequests: 1},
			Candidate{PrefillTokens: 100, ActiveBlocks: 2, ActiveRequests: 1, PendingRequests: 2}},
		{"absurd counts are clamped, so sums cannot wrap", Load{PrefillTokens: math.MaxInt, ActiveRequests: math.MaxInt},
			Candidate{PrefillTokens: 100 + MaxPeerCount, ActiveBlocks: 2, ActiveRequests: 1 + MaxPeerCount, PendingRequests: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b.SetPeerLoad("w", tt.peer)
			c := []Candidate{{Worker: "w"}}
			b.Fill(c, []uint64{1, 2, 3}, "")
			got := Candidate{PrefillTokens: c[0].PrefillTokens, ActiveBlocks: c[0].ActiveBlocks, ActiveRequests: c[0].ActiveRequests, PendingRequests: c[0].PendingRequests}
			assert.Equal(t, tt.want, got)
			assert.Equal(t, 1, c[0].NewBlocks, "the request's new blocks are this ledger's")
			assert.Equal(t, Load{PrefillTokens: 100, ActiveBlocks: 2, ActiveRequests: 1, PendingRequests: 1}, b.Load("w"), "Load stays this ledger's own")
			loads, _ := b.LoadsWithAdapters()
			assert.Equal(t, map[string]Load{"w": b.Load("w")}, loads, "so do the loads the other replicas read")
		})
	}

	b.SetPeerLoad("idle", Load{ActiveRequests: 5})
	c := []Candidate{{Worker: "idle"}}
	b.Fill(c, nil, "")
	assert.Equal(t, 5, c[0].ActiveRequests, "a worker this router booked nothing on still gets its peers' load")
	// The worker leaves the fleet and comes back while the peers still run 5 requests
	// there: package peers gives a sum only when it changes, so the ledger must still
	// hold it; the peers withdraw it when they stop reporting the worker.
	b.RemoveWorker("idle")
	b.Fill(c, nil, "")
	assert.Equal(t, 5, c[0].ActiveRequests, "a worker back in the fleet still has its peers' load")
	b.SetPeerLoad("idle", Load{})
	b.Fill(c, nil, "")
	assert.Zero(t, c[0].ActiveRequests, "withdrawn by the peers")
}

func TestPeerLoadUnderConcurrentUseStaysOutOfTheOwnLedgerAndMetrics(t *testing.T) {
	// An exchange sets peer load while decisions fill candidates, book and release, and
	// Prometheus collects: the fill sees own plus peers, while Load and the gauges, which
	// report what this router booked, never include the peers' counts.
	b := NewBookings()
	reg := prometheus.NewPedanticRegistry()
	NewMetrics(reg, b, func() []string { return []string{"a", "b"} })
	peer := Load{PrefillTokens: 1000, ActiveBlocks: 500, ActiveRequests: 300, PendingRequests: 300}
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 501 { // ends with both workers set
			p := peer
			if i%2 == 1 {
				p = Load{} // forgets, then sets again
			}
			b.SetPeerLoad([]string{"a", "b"}[i%2], p)
			b.SetPeerLoad([]string{"a", "b"}[(i+1)%2], peer)
		}
	})
	for g := range 4 {
		wg.Go(func() {
			for i := range 300 {
				worker := []string{"a", "b"}[(g+i)%2]
				c := []Candidate{{Worker: "a"}, {Worker: "b"}}
				b.Fill(c, []uint64{1, 2}, "")
				k := b.Book(worker, []uint64{1, 2}, 64)
				if l := b.Load(worker); l.ActiveRequests > 4 || l.PrefillTokens > 4*64 {
					t.Errorf("own load %+v includes peers'", l)
				}
				k.PrefillDone()
				k.Release()
			}
		})
	}
	wg.Go(func() {
		for range 50 {
			families, err := reg.Gather()
			if err != nil {
				t.Error(err)
				return
			}
			for _, f := range families {
				for _, m := range f.GetMetric() {
					if v := m.GetGauge().GetValue(); v > 4*64 {
						t.Errorf("%s %v includes peers' load", f.GetName(), v)
					}
				}
			}
		}
	})
	wg.Wait()

	for _, w := range []string{"a", "b"} {
		assert.Equal(t, Load{}, b.Load(w), w)
		c := []Candidate{{Worker: w}}
		b.Fill(c, nil, "")
		assert.Equal(t, []int{1000, 300, 300}, []int{c[0].PrefillTokens, c[0].ActiveRequests, c[0].PendingRequests}, "the last exchange's counts, %s", w)
	}
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		for _, m := range f.GetMetric() {
			assert.Zero(t, m.GetGauge().GetValue(), f.GetName())
		}
	}
}

func TestRemovedWorkersLeaveNothingInTheLedger(t *testing.T) {
	// Worker names come and go (pods): once a removed worker's bookings are released
	// and its peers withdraw their load there (package peers does when no peer reports
	// it), the ledger holds nothing of it, however many blocks it once had.
	b := NewBookings()
	for i := range 100 {
		name := fmt.Sprintf("pod-%d", i)
		blocks := make([]uint64, 1000)
		for j := range blocks {
			blocks[j] = uint64(i*1000 + j)
		}
		k := b.Book(name, blocks, 64_000)
		b.SetPeerLoad(name, Load{ActiveRequests: 2})
		b.RemoveWorker(name)
		k.Release()
		b.SetPeerLoad(name, Load{})
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	assert.Empty(t, b.workers)
	assert.Empty(t, b.peers)
}

// TestVersionMovesWithTheOwnCountsOnly: a reader that sees the same version twice saw
// the same own counts (package peers sends a report when it moves); peer load, and
// calls that change nothing, leave it. The steps run in order, on one booking.
func TestVersionMovesWithTheOwnCountsOnly(t *testing.T) {
	b := NewBookings()
	var k *Booking
	for _, step := range []struct {
		name  string
		do    func()
		moves bool
	}{
		{"book", func() { k = b.Book("w", []uint64{1}, 10) }, true},
		{"peer load", func() { b.SetPeerLoad("w", Load{ActiveRequests: 3}) }, false},
		{"first token", func() { k.PrefillDone() }, true},
		{"first token again", func() { k.PrefillDone() }, false},
		{"release", func() { k.Release() }, true},
		{"release again", func() { k.Release() }, false},
	} {
		before := b.Version()
		step.do()
		assert.Equal(t, step.moves, b.Version() != before, step.name)
	}
}

func TestEngineRequestsBeyondTheBookingsJoinN(t *testing.T) {
	tests := []struct {
		name       string
		own, peers int // requests booked on w by this ledger and by its peers
		engine     int // what w's engine says it runs and queues
		unseen     int // the N(w) it adds
	}{
		{"the engine runs only what was booked", 2, 0, 2, 0},
		{"booked but not yet at the engine is not negative load", 3, 0, 1, 0},
		{"traffic past kvroute joins N", 2, 0, 5, 3},
		{"the peers' requests are not unseen", 2, 3, 5, 0},
		{"past kvroute and its peers", 2, 3, 9, 4},
		{"a worker nothing was booked on", 0, 0, 4, 4},
		{"no reading forgets", 0, 0, -1, 0},
		{"absurd counts are clamped", 0, 0, math.MaxInt, MaxPeerCount},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := NewBookings()
			for range tt.own {
				b.Book("w", []uint64{1}, 10)
			}
			b.SetPeerLoad("w", Load{ActiveRequests: tt.peers})
			b.SetEngineRequests("w", 7) // an earlier reading, replaced by the next
			b.SetEngineRequests("w", tt.engine)
			c := []Candidate{{Worker: "w"}, {Worker: "other"}}
			b.Fill(c, []uint64{1}, "")
			assert.Equal(t, tt.unseen, c[0].UnseenRequests)
			assert.Equal(t, tt.own+tt.peers+tt.unseen, c[0].ActiveRequests)
			assert.Equal(t, tt.unseen, b.UnseenRequests("w"))
			assert.Zero(t, c[1].UnseenRequests, "another worker's reading is its own")
			assert.Equal(t, tt.own, b.Load("w").ActiveRequests, "Load, the peers' report, stays this ledger's own")
		})
	}
}

func TestUnseenRequestsStayUntilTheNextReadingAndGoWithTheWorker(t *testing.T) {
	b := NewBookings()
	k := b.Book("w", []uint64{1}, 10)
	b.SetEngineRequests("w", 4) // 3 past kvroute
	k.Release()
	c := []Candidate{{Worker: "w", UnseenRequests: 9}}
	b.Fill(c, nil, "")
	assert.Equal(t, 3, c[0].ActiveRequests, "the unseen count is of the reading's moment: a booking ending after it does not grow it")
	b.SetEngineRequests("w", 1)
	b.Fill(c, nil, "")
	assert.Equal(t, 1, c[0].ActiveRequests, "the next reading replaces it")

	// A stale UnseenRequests in a reused candidate slice is reset, peers or not.
	b.SetEngineRequests("w", 0)
	c[0].UnseenRequests = 9
	b.Fill(c, nil, "")
	assert.Zero(t, c[0].UnseenRequests)

	b.SetEngineRequests("w", 6)
	b.RemoveWorker("w")
	b.Fill(c, nil, "")
	assert.Zero(t, c[0].ActiveRequests, "a removed worker's engine reading goes with it")
	assert.Zero(t, b.UnseenRequests("w"))
}

func TestUnseenRequestsCountForTheQueueOnlyWhereBatchSlotsAreKnown(t *testing.T) {
	p := DefaultParams()
	req := &Request{PromptTokens: 64, BlockSize: 64, Blocks: []uint64{1}}
	b := NewBookings()
	b.SetEngineRequests("full", 4)
	c := []Candidate{{Worker: "full", MaxNumSeqs: 4}, {Worker: "unknown"}}
	b.SetEngineRequests("unknown", 4)
	b.Fill(c, req.Blocks, "")
	assert.Equal(t, 1, p.Cost(req, c[0]).Queued, "4 requests past kvroute fill its 4 slots: this one would wait")
	assert.Zero(t, p.Cost(req, c[1]).Queued, "without max_num_seqs, requests are not queue")
}

func TestUnseenRequestsAreAGaugePerWorker(t *testing.T) {
	b := NewBookings()
	reg := prometheus.NewPedanticRegistry()
	NewMetrics(reg, b, func() []string { return []string{"w", "idle"} })
	b.Book("w", []uint64{1}, 10)
	b.SetEngineRequests("w", 4)
	want := `
# HELP kvroute_scoring_unseen_requests Requests the worker's engine ran or queued beyond every booking at its last scrape: traffic that did not come through kvroute, counted in N.
# TYPE kvroute_scoring_unseen_requests gauge
kvroute_scoring_unseen_requests{worker="idle"} 0
kvroute_scoring_unseen_requests{worker="w"} 3
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), "kvroute_scoring_unseen_requests"))
}

// A request the engine runs as several sequences (parallel samples, a batch's prompts)
// takes that many batch slots: each sequence counts in N, and in W until the first
// token, as the engine's running and waiting requests count them; the shared prompt's
// blocks and prefill count once. Every way a booking ends takes all of them back, and
// the engine's count of the same sequences reads as nothing unseen.
func TestABookingOfSeveralSequencesTakesThatManySlots(t *testing.T) {
	end := []struct {
		name string
		do   func(k *Booking)
	}{
		{"released", func(k *Booking) { k.Release() }},
		{"cancelled", func(k *Booking) { k.Cancel() }},
		{"first token, then released", func(k *Booking) { k.PrefillDone(); k.Release() }},
		{"moved to a fallback, then released", func(k *Booking) { k.MoveTo("fallback", 10); k.Release() }},
	}
	for _, tt := range end {
		t.Run(tt.name, func(t *testing.T) {
			b := NewBookings()
			other := b.Book("w", []uint64{1}, 8)
			k := b.BookSequences("w", "", []uint64{1, 2}, 64, DefaultPrefillHistoryHalfLife, 8)
			assert.Equal(t, Load{PrefillTokens: 72, ActiveBlocks: 2, ActiveRequests: 9, PendingRequests: 9}, b.Load("w"))
			b.SetEngineRequests("w", 9)
			assert.Zero(t, b.UnseenRequests("w"), "the engine's nine requests are the nine booked")
			tt.do(k)
			assert.Equal(t, Load{PrefillTokens: 8, ActiveBlocks: 1, ActiveRequests: 1, PendingRequests: 1}, b.Load("w"))
			assert.Equal(t, Load{}, b.Load("fallback"))
			other.Release()
			assert.Equal(t, Load{}, b.Load("w"))
		})
	}
	b := NewBookings()
	k := b.BookSequences("w", "", []uint64{1}, 4, DefaultPrefillHistoryHalfLife, 0)
	assert.Equal(t, 1, b.Load("w").ActiveRequests, "fewer than one sequence is one")
	k.PrefillDone()
	assert.Equal(t, Load{ActiveBlocks: 1, ActiveRequests: 1}, b.Load("w"))
	k.Release()
}
