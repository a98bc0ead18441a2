package scoring

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPrefillHistoryChargesAWorkersRecentPrefill(t *testing.T) {
	// bs 64: H(w) of 6,400 tokens is 100 blocks.
	req := &Request{PromptTokens: 640, BlockSize: 64, Blocks: make([]uint64, 10)}
	tests := []struct {
		name           string
		weight, half   float64
		c              Candidate
		recent, charge float64
	}{
		{"off: the history is not read", 0, 30, Candidate{PrefillHistory: 6400}, 0, 0},
		{"just booked: all of it", 0.5, 30, Candidate{PrefillHistory: 6400}, 6400, 0.5 * 100},
		{"one half-life ago: half", 0.5, 30, Candidate{PrefillHistory: 6400, PrefillHistoryAge: 30 * time.Second}, 3200, 0.5 * 50},
		{"two half-lives ago: a quarter", 2, 10, Candidate{PrefillHistory: 6400, PrefillHistoryAge: 20 * time.Second}, 1600, 2 * 25},
		{"no half-life: forgotten at once", 1, 0, Candidate{PrefillHistory: 6400}, 0, 0},
		{"a clock stepped back decays nothing", 1, 30, Candidate{PrefillHistory: 6400, PrefillHistoryAge: -time.Minute}, 6400, 100},
		{"nothing booked", 1, 30, Candidate{}, 0, 0},
		{"the peers' history adds to this router's", 0.5, 30, Candidate{PrefillHistory: 3200, PeerPrefillHistory: 3200}, 6400, 0.5 * 100},
		{"each decays over its own age", 0.5, 30,
			Candidate{PrefillHistory: 6400, PrefillHistoryAge: 30 * time.Second, PeerPrefillHistory: 6400, PeerPrefillHistoryAge: 60 * time.Second}, 3200 + 1600, 0.5 * 75},
		{"the peers' alone", 1, 30, Candidate{PeerPrefillHistory: 6400}, 6400, 100},
		{"off: the peers' history is not read either", 0, 30, Candidate{PeerPrefillHistory: 6400}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := DynamoParams()
			p.PrefillHistoryWeight, p.PrefillHistoryHalfLife = tt.weight, tt.half
			require.NoError(t, p.Validate())
			got := p.Cost(req, tt.c)
			assert.InDelta(t, tt.recent, got.RecentPrefill, 1e-9)
			assert.InDelta(t, tt.charge, got.History, 1e-9)
			assert.InDelta(t, got.Prefill+float64(tt.c.ActiveBlocks)+float64(tt.c.NewBlocks)+got.Requests+got.Affinity+got.History, got.Cost, 1e-9)
		})
	}
	assert.Zero(t, DefaultParams().PrefillHistoryWeight, "off unless configured")
	assert.Equal(t, float64(DefaultPrefillHistoryHalfLife), DefaultParams().PrefillHistoryHalfLife)
}

func TestBookingsKeepEachWorkersDecayedPrefill(t *testing.T) {
	now := time.Unix(1000, 0)
	b := NewBookingsResident(0, func() time.Time { return now })
	half := 30.0

	first := b.BookDecision("w", "", []uint64{1, 2}, 1000, half)
	assert.InDelta(t, 1000, b.PrefillHistory("w", half), 1e-9)
	first.PrefillDone()
	first.Release()
	assert.InDelta(t, 1000, b.PrefillHistory("w", half), 1e-9, "the history outlives the booking")

	now = now.Add(30 * time.Second)
	assert.InDelta(t, 500, b.PrefillHistory("w", half), 1e-9)
	c := []Candidate{{Worker: "w"}, {Worker: "new"}}
	b.Fill(c, nil, "")
	assert.Equal(t, 1000.0, c[0].PrefillHistory)
	assert.Equal(t, 30*time.Second, c[0].PrefillHistoryAge)
	assert.Zero(t, c[1].PrefillHistory)

	second := b.BookDecision("w", "", []uint64{3}, 250, half)
	assert.InDelta(t, 750, b.PrefillHistory("w", half), 1e-9, "decayed to the booking, then added")
	b.Fill(c, nil, "")
	assert.Equal(t, 750.0, c[0].PrefillHistory)
	assert.Zero(t, c[0].PrefillHistoryAge)

	b.RemoveWorker("w")
	assert.InDelta(t, 750, b.PrefillHistory("w", half), 1e-9, "a departed worker keeps its load while a request runs there")
	second.Release()
	assert.Zero(t, b.PrefillHistory("w", half), "and goes with its last request")
	b.Fill(c, nil, "")
	assert.Zero(t, c[0].PrefillHistory)
}

// TestPeersPrefillHistoryJoinsTheWorkersOwn: the other replicas' history
// (SetPeerHistory) reaches the candidates beside this ledger's own, decays from when it
// was set on the ledger's clock, and is bounded: what a peer sends cannot reach the
// cost as a negative, NaN, infinite or huge value.
func TestPeersPrefillHistoryJoinsTheWorkersOwn(t *testing.T) {
	tests := []struct {
		name   string
		tokens float64
		want   float64 // PeerPrefillHistory in Fill
	}{
		{"a history", 1000, 1000},
		{"0 forgets", 0, 0},
		{"negative: none", -5, 0},
		{"NaN: none", math.NaN(), 0},
		{"infinite: capped", math.Inf(1), MaxPeerCount},
		{"huge: capped", 1e300, MaxPeerCount},
		{"minus infinity: none", math.Inf(-1), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Unix(1000, 0)
			b := NewBookingsResident(0, func() time.Time { return now })
			b.SetPeerHistory("w", 77) // replaced
			b.SetPeerHistory("w", tt.tokens)
			c := []Candidate{{Worker: "w"}, {Worker: "other"}}
			b.Fill(c, nil, "")
			assert.Equal(t, tt.want, c[0].PeerPrefillHistory)
			assert.Zero(t, c[0].PeerPrefillHistoryAge)
			assert.Zero(t, c[1].PeerPrefillHistory, "per worker")
			assert.Zero(t, c[0].PrefillHistory, "this ledger's own stays its own")
			assert.Nil(t, b.PrefillHistories(), "and so does what it reports")

			now = now.Add(30 * time.Second)
			b.Fill(c, nil, "")
			if tt.want > 0 {
				assert.Equal(t, 30*time.Second, c[0].PeerPrefillHistoryAge, "it ages on the ledger's clock")
				p := DynamoParams()
				p.PrefillHistoryWeight = 1
				assert.InDelta(t, tt.want/2, p.Cost(&Request{BlockSize: 16}, c[0]).RecentPrefill, 1e-6*tt.want, "one half-life later: half")
			}
		})
	}
}

// TestPrefillHistoriesAreWhatAReportCarries: each worker's history as of its last
// booking, how long ago that was, and that booking's half-life; read again later only
// the age differs, and Version does not move (package peers then sends no report).
func TestPrefillHistoriesAreWhatAReportCarries(t *testing.T) {
	now := time.Unix(1000, 0)
	b := NewBookingsResident(0, func() time.Time { return now })
	assert.Nil(t, b.PrefillHistories(), "nothing booked")
	b.BookDecision("a", "", nil, 1000, 30).Release()
	b.BookDecision("b", "", nil, 800, 10)
	b.BookDecision("forgetful", "", nil, 500, 0) // a route with no half-life remembers nothing
	b.Book("idle", nil, 0)
	version := b.Version()

	assert.Equal(t, map[string]History{"a": {1000, 0, 30}, "b": {800, 0, 10}}, b.PrefillHistories())
	now = now.Add(30 * time.Second)
	got := b.PrefillHistories()
	assert.Equal(t, map[string]History{"a": {1000, 30 * time.Second, 30}, "b": {800, 30 * time.Second, 10}}, got)
	assert.InDelta(t, 500, got["a"].After(0), 1e-9, "a: one of its half-lives")
	assert.InDelta(t, 100, got["b"].After(0), 1e-9, "b: three of its own")
	assert.InDelta(t, 250, got["a"].After(30*time.Second), 1e-9)
	assert.Equal(t, version, b.Version(), "decay is no change of the bookings")

	b.BookDecision("a", "", nil, 100, 60).Release() // a route with a half-life of its own
	got = b.PrefillHistories()
	assert.InDelta(t, 1000*math.Exp2(-0.5)+100, got["a"].Tokens, 1e-9, "decayed to the booking with its half-life, then added")
	assert.Equal(t, 60.0, got["a"].HalfLife, "and it decays with that half-life from then on")
}
