package scoring

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func withAffinity(p Params, alpha float64) Params { p.PrefixAffinityWeight = alpha; return p }

// TestReferenceDecisions pins the three decisions of DESIGN §3: bs 64, isl 3008 (R=47).
func TestReferenceDecisions(t *testing.T) {
	req := &Request{PromptTokens: 3008, BlockSize: 64, Blocks: make([]uint64, 47)}
	holder := Candidate{Worker: "holder", Overlap: 46, ActiveBlocks: 143}
	cold := Candidate{Worker: "cold", Overlap: 0, ActiveBlocks: 95}
	busyHolder := holder
	busyHolder.ActiveBlocks = 160

	tests := []struct {
		name       string
		params     Params
		candidates []Candidate
		want       string
		wantCosts  []float64
	}{
		{"default cost sends the session to the cold worker", DynamoParams(), []Candidate{holder, cold}, "cold", []float64{144, 142}},
		{"affinity 0.25 keeps it on the holder", withAffinity(DynamoParams(), 0.25), []Candidate{holder, cold}, "holder", []float64{144.25, 153.75}},
		{"affinity 0.25 yields when the holder is loaded enough", withAffinity(DynamoParams(), 0.25), []Candidate{busyHolder, cold}, "cold", []float64{161.25, 153.75}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			picker, err := NewKVCost(tt.params, rand.New(rand.NewPCG(1, 2)))
			require.NoError(t, err)
			d, err := picker.Pick(context.Background(), req, tt.candidates)
			require.NoError(t, err)
			assert.Equal(t, tt.want, d.Worker)
			for i, want := range tt.wantCosts {
				assert.InDelta(t, want, d.Terms[i].Cost, 1e-9, tt.candidates[i].Worker)
			}
		})
	}
}

func TestCostTerms(t *testing.T) {
	p := Params{OverlapCredit: 1, PrefillLoadScale: 2, ActiveRequestWeight: 3, PrefixAffinityWeight: 0.5, FloorPrefill: true}
	req := &Request{PromptTokens: 130, BlockSize: 64, Blocks: make([]uint64, 2)} // R=3, F=2
	got := p.Cost(req, Candidate{Overlap: 1, PrefillTokens: 62, ActiveBlocks: 10, NewBlocks: 1, ActiveRequests: 2})
	// prefill = (62+130)/64 − 1 = 2; cost = 2·2 + 10 + 1 + 3·2 + 0.5·(3−1)
	assert.InDelta(t, 4.0, got.Prefill, 1e-12)
	assert.InDelta(t, 6.0, got.Requests, 1e-12)
	assert.InDelta(t, 1.0, got.Affinity, 1e-12)
	assert.InDelta(t, 22.0, got.Cost, 1e-12)
}

func TestFloorPrefill(t *testing.T) {
	req := &Request{PromptTokens: 64, BlockSize: 64, Blocks: make([]uint64, 1)}
	c := Candidate{Overlap: 1}
	p := Params{OverlapCredit: 3, PrefillLoadScale: 1}
	assert.InDelta(t, -2.0, p.Cost(req, c).Prefill, 1e-12, "unclamped credit can go below zero")
	p.FloorPrefill = true
	assert.InDelta(t, 0.0, p.Cost(req, c).Prefill, 1e-12)
}

func TestEmptyPromptIsChargedNothingWhateverTheWeights(t *testing.T) {
	req := &Request{PromptTokens: 0, BlockSize: 64}
	p := Params{OverlapCredit: 5, PrefillLoadScale: 7, ActiveRequestWeight: 0, PrefixAffinityWeight: 1e6, FloorPrefill: false}
	got := p.Cost(req, Candidate{})
	assert.Zero(t, got.Affinity)
	assert.Zero(t, got.Prefill)
	assert.Zero(t, got.Cost)
}

func TestParamsRejectNegativeNaNAndInfinite(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(*Params)
		field string
	}{
		{"negative overlap credit", func(p *Params) { p.OverlapCredit = -1 }, "overlap_credit"},
		{"NaN prefill scale", func(p *Params) { p.PrefillLoadScale = math.NaN() }, "prefill_load_scale"},
		{"infinite request weight", func(p *Params) { p.ActiveRequestWeight = math.Inf(1) }, "active_request_weight"},
		{"negative affinity", func(p *Params) { p.PrefixAffinityWeight = -0.25 }, "prefix_affinity_weight"},
		{"negative session affinity", func(p *Params) { p.SessionAffinityWeight = -1 }, "session_affinity_weight"},
		{"negative infinite temperature", func(p *Params) { p.Temperature = math.Inf(-1) }, "temperature"},
		{"negative queue weight", func(p *Params) { p.QueueWeight = -64 }, "queue_weight"},
		{"NaN interference weight", func(p *Params) { p.InterferenceWeight = math.NaN() }, "interference_weight"},
		{"negative prefill history weight", func(p *Params) { p.PrefillHistoryWeight = -0.1 }, "prefill_history_weight"},
		{"NaN prefill history half-life", func(p *Params) { p.PrefillHistoryHalfLife = math.NaN() }, "prefill_history_half_life"},
		{"NaN shared prefix affinity", func(p *Params) { p.SharedPrefixAffinity = math.NaN() }, "shared_prefix_affinity"},
		{"shared prefix affinity above 1", func(p *Params) { p.SharedPrefixAffinity = 1.5 }, "shared_prefix_affinity"},
		{"offload credit above 1", func(p *Params) { p.OffloadCredit = 1.01 }, "offload_credit"},
		{"negative offload credit", func(p *Params) { p.OffloadCredit = -0.5 }, "offload_credit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := DynamoParams()
			tt.edit(&p)
			err := p.Validate()
			var fe *FieldError
			require.ErrorAs(t, err, &fe)
			assert.Equal(t, tt.field, fe.Field)

			_, err = NewKVCost(p, nil)
			assert.Error(t, err, "the constructor rejects it too")

			picker, _ := NewKVCost(DynamoParams(), nil)
			_, err = picker.Pick(context.Background(), &Request{BlockSize: 64, Params: &p}, []Candidate{{Worker: "a"}})
			assert.ErrorAs(t, err, &fe, "a per-request override is validated the same way")
		})
	}
	require.NoError(t, DefaultParams().Validate())
}

func TestPerRequestParamsOverrideOnlyThatRequest(t *testing.T) {
	picker, err := NewKVCost(DynamoParams(), rand.New(rand.NewPCG(1, 1)))
	require.NoError(t, err)
	cands := []Candidate{{Worker: "holder", Overlap: 46, ActiveBlocks: 143}, {Worker: "cold", ActiveBlocks: 95}}
	override := withAffinity(DynamoParams(), 0.25)
	blocks := make([]uint64, 47)

	d, _ := picker.Pick(context.Background(), &Request{PromptTokens: 3008, BlockSize: 64, Blocks: blocks, Params: &override}, cands)
	assert.Equal(t, "holder", d.Worker)
	d, _ = picker.Pick(context.Background(), &Request{PromptTokens: 3008, BlockSize: 64, Blocks: blocks}, cands)
	assert.Equal(t, "cold", d.Worker)
}

func TestCachePressurePricesMissingBlocksByOccupancy(t *testing.T) {
	p := DynamoParams()
	p.CachePressureWeight = 10
	req := &Request{PromptTokens: 640, BlockSize: 64, Blocks: make([]uint64, 10)} // R = 10
	tests := []struct {
		name string
		c    Candidate
		want float64
	}{
		{"empty cache costs nothing", Candidate{Overlap: 0, HeldBlocks: 0, CapacityBlocks: 100}, 0},
		{"half-full cache, all 10 blocks missing", Candidate{Overlap: 0, HeldBlocks: 50, CapacityBlocks: 100}, 50},
		{"full cache, 2 blocks missing", Candidate{Overlap: 8, HeldBlocks: 100, CapacityBlocks: 100}, 20},
		{"occupancy is capped at 1", Candidate{Overlap: 8, HeldBlocks: 300, CapacityBlocks: 100}, 20},
		{"unknown capacity charges nothing", Candidate{Overlap: 0, HeldBlocks: 50}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := p.Cost(req, tt.c)
			assert.InDelta(t, tt.want, got.Pressure, 1e-9)
			assert.InDelta(t, got.Prefill+float64(tt.c.ActiveBlocks)+float64(tt.c.NewBlocks)+got.Requests+got.Affinity+got.Pressure, got.Cost, 1e-9)
		})
	}
	assert.Zero(t, p.Cost(&Request{BlockSize: 64}, Candidate{HeldBlocks: 100, CapacityBlocks: 100}).Pressure, "an empty prompt pays no pressure")
}

func TestParamsSetByName(t *testing.T) {
	p := DynamoParams()
	require.NoError(t, p.Set("prefix_affinity_weight", "4"))
	require.NoError(t, p.Set("floor_prefill", "false"))
	require.NoError(t, p.Set("session_affinity_weight", "1.5"))
	assert.Equal(t, 1.5, p.SessionAffinityWeight)
	assert.Equal(t, 4.0, p.PrefixAffinityWeight)
	assert.False(t, p.FloorPrefill)
	var fe *FieldError
	assert.ErrorAs(t, p.Set("prefix_afinity_weight", "4"), &fe)
	assert.ErrorAs(t, p.Set("temperature", "-1"), &fe)
	assert.Equal(t, 0.0, p.Temperature, "a rejected value leaves the parameter unchanged")
	assert.ErrorAs(t, p.Set("overlap_credit", "lots"), &fe)
	require.NoError(t, p.Set("queue_weight", "32"))
	require.NoError(t, p.Set("shared_prefix_affinity", "0.5"))
	assert.Equal(t, [2]float64{32, 0.5}, [2]float64{p.QueueWeight, p.SharedPrefixAffinity})
	require.ErrorAs(t, p.Set("shared_prefix_affinity", "2"), &fe)
	assert.Equal(t, "shared_prefix_affinity", fe.Field)
	assert.Equal(t, 0.5, p.SharedPrefixAffinity, "a share above 1 is rejected and changes nothing")
}

// TestSessionAffinityIsABiasNotAPin: the session's last worker is credited σ·R blocks,
// which keeps the session there against a smaller load gap but not a larger one.
func TestSessionAffinityIsABiasNotAPin(t *testing.T) {
	// isl 640, bs 64: R = 10. Neither worker holds the (rewritten) prompt.
	req := &Request{PromptTokens: 640, BlockSize: 64, Blocks: make([]uint64, 10)}
	tests := []struct {
		name       string
		sigma      float64
		sessionD   int // active blocks on the session's worker; the other worker has 0
		want       string
		wantCredit float64
	}{
		{"weight 0 changes nothing: the idle worker wins", 0, 5, "other", 0},
		{"σ·R outweighs a small load gap", 1, 5, "session", -10},
		{"a load gap larger than σ·R moves the session", 1, 15, "other", -10},
		{"a larger weight holds against that gap", 2, 15, "session", -20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := DynamoParams()
			p.SessionAffinityWeight = tt.sigma
			picker, err := NewKVCost(p, rand.New(rand.NewPCG(1, 2)))
			require.NoError(t, err)
			d, err := picker.Pick(context.Background(), req, []Candidate{
				{Worker: "session", ActiveBlocks: tt.sessionD, SessionWorker: true}, {Worker: "other"},
			})
			require.NoError(t, err)
			assert.Equal(t, tt.want, d.Worker)
			assert.InDelta(t, tt.wantCredit, d.Terms[0].Session, 1e-12)
			assert.Zero(t, d.Terms[1].Session, "only the session's worker is credited")
			assert.InDelta(t, d.Terms[0].Prefill+float64(tt.sessionD)+d.Terms[0].Session, d.Terms[0].Cost, 1e-12, "the credit is part of the total")
		})
	}
}

// TestOffloadedBlocksArePricedBetweenAHitAndAMiss pins the offload credit u: a block
// the worker holds in host memory, continuing its device run, earns u of a cached
// block's prefill credit and is charged 1 − u of a missing block's affinity, pressure
// and interference. bs 64, isl 640 (R = 10).
func TestOffloadedBlocksArePricedBetweenAHitAndAMiss(t *testing.T) {
	req := &Request{PromptTokens: 640, BlockSize: 64, Blocks: make([]uint64, 10)}
	base := Params{OverlapCredit: 1, PrefillLoadScale: 1, PrefixAffinityWeight: 4, CachePressureWeight: 2,
		InterferenceWeight: 1, SharedPrefixAffinity: 1, FloorPrefill: true}
	with := func(u, h float64) Params { p := base; p.OffloadCredit, p.SharedPrefixAffinity = u, h; return p }
	// Device run 2, then 6 offloaded blocks; 2 requests running; the cache half full.
	c := Candidate{Overlap: 2, OffloadedBlocks: 6, ActiveRequests: 2, HeldBlocks: 50, CapacityBlocks: 100}

	tests := []struct {
		name   string
		params Params
		c      Candidate
		// prefill = 10 − (2 + u·o); charged m = 8 − (1−h)·shared − u·o (+ overlap)
		prefill, affinity, pressure, interference float64
	}{
		{"credit 0 prices them as missing (Dynamo)", with(0, 1), c, 8, 4 * 8, 2 * 8 * 0.5, 2 * 8},
		{"credit 1 prices them as device hits", with(1, 1), c, 2, 4 * 2, 2 * 2 * 0.5, 2 * 2},
		{"credit 0.75 charges each a quarter of a miss", with(0.75, 1), c, 3.5, 4 * 3.5, 2 * 3.5 * 0.5, 2 * 3.5},
		{"offloaded blocks beyond the prompt count only up to it", with(1, 1),
			Candidate{Overlap: 2, OffloadedBlocks: 50, ActiveRequests: 2, HeldBlocks: 50, CapacityBlocks: 100}, 0, 0, 0, 0},
		// 4 missing blocks are a hot shared prefix (h = 0.5) and 6 offloaded: the 4 in
		// both take the larger discount (u = 0.75), the other 2 offloaded take u:
		// m = 8 − 0.75·4 − 0.75·2 = 3.5 (the shared discount adds nothing).
		{"a block both shared and offloaded gets the larger discount, not both", with(0.75, 0.5),
			Candidate{Overlap: 2, OffloadedBlocks: 6, ActiveRequests: 2, HeldBlocks: 50, CapacityBlocks: 100}, 3.5, 4 * 3.5, 2 * 3.5 * 0.5, 2 * 3.5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := *req
			if tt.params.SharedPrefixAffinity < 1 {
				r.SharedPrefixBlocks = 6 // 4 of the missing blocks
			}
			got := tt.params.Cost(&r, tt.c)
			assert.InDelta(t, tt.prefill, got.Prefill, 1e-12, "prefill")
			assert.InDelta(t, tt.affinity, got.Affinity, 1e-12, "affinity")
			assert.InDelta(t, tt.pressure, got.Pressure, 1e-12, "pressure")
			assert.InDelta(t, tt.interference, got.Interference, 1e-12, "interference")
			assert.InDelta(t, 8-tt.prefill, got.LoadCredit, 1e-12, "load credit: u·o blocks, what the prefill term took off")
		})
	}

	// The decision it changes: a holder whose tail was offloaded against a cold worker
	// two requests lighter. Counted as missing, the tail sends the session away; loaded
	// at a quarter of a miss, the holder keeps it.
	holder := Candidate{Worker: "holder", Overlap: 2, OffloadedBlocks: 7, ActiveRequests: 2}
	cold := Candidate{Worker: "cold"}
	for _, tt := range []struct {
		credit float64
		want   string
	}{{0, "cold"}, {0.75, "holder"}} {
		p := base
		p.CachePressureWeight, p.InterferenceWeight, p.ActiveRequestWeight = 0, 0, 16
		p.OffloadCredit = tt.credit
		picker, err := NewKVCost(p, rand.New(rand.NewPCG(1, 2)))
		require.NoError(t, err)
		d, err := picker.Pick(context.Background(), req, []Candidate{holder, cold})
		require.NoError(t, err)
		assert.Equal(t, tt.want, d.Worker, "offload_credit %v", tt.credit)
	}
}

// TestMemoryChargesTheBlocksARequestWouldWaitFor pins μ: the blocks the worker's device
// lacks for the request beside the requests active there, D + new − capacity.
func TestMemoryChargesTheBlocksARequestWouldWaitFor(t *testing.T) {
	req := &Request{PromptTokens: 1280, BlockSize: 64, Blocks: make([]uint64, 20)}
	p := Params{OverlapCredit: 1, PrefillLoadScale: 1, MemoryWeight: 64, FloorPrefill: true}
	tests := []struct {
		name      string
		c         Candidate
		wantShort int
	}{
		{"room for the request: nothing", Candidate{ActiveBlocks: 80, NewBlocks: 20, CapacityBlocks: 100}, 0},
		{"ten blocks short", Candidate{ActiveBlocks: 90, NewBlocks: 20, CapacityBlocks: 100}, 10},
		{"blocks already active are not needed again", Candidate{ActiveBlocks: 95, NewBlocks: 5, CapacityBlocks: 100}, 0},
		{"capacity unknown: nothing", Candidate{ActiveBlocks: 1000, NewBlocks: 20}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := p.Cost(req, tt.c)
			assert.Equal(t, tt.wantShort, got.ShortBlocks)
			assert.InDelta(t, 64*float64(tt.wantShort), got.Memory, 1e-12)
			without := p
			without.MemoryWeight = 0
			assert.InDelta(t, got.Memory, got.Cost-without.Cost(req, tt.c).Cost, 1e-9, "the term is in the cost")
		})
	}
}
