package scoring

import (
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
