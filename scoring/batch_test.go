package scoring

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestQueueTermCountsRequestsWaitingForAFirstToken(t *testing.T) {
	p := Params{QueueWeight: 10}
	req := &Request{PromptTokens: 64, BlockSize: 64, Blocks: make([]uint64, 1)}
	tests := []struct {
		name string
		c    Candidate
		want int
	}{
		{"idle worker", Candidate{}, 0},
		{"requests still in prefill or queued", Candidate{ActiveRequests: 3, PendingRequests: 2}, 2},
		{"batch slots unknown: decoding requests do not count", Candidate{ActiveRequests: 9}, 0},
		{"free slot left", Candidate{ActiveRequests: 3, MaxNumSeqs: 4}, 0},
		{"every slot busy decoding: this request would wait", Candidate{ActiveRequests: 4, MaxNumSeqs: 4}, 1},
		{"beyond the slots, counting this request", Candidate{ActiveRequests: 6, PendingRequests: 2, MaxNumSeqs: 4}, 3},
		{"more in prefill than beyond the slots", Candidate{ActiveRequests: 6, PendingRequests: 5, MaxNumSeqs: 4}, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := p.Cost(req, tt.c)
			assert.Equal(t, tt.want, got.Queued)
			assert.InDelta(t, 10*float64(tt.want), got.Queue, 1e-12)
			assert.InDelta(t, got.Prefill+float64(tt.c.ActiveBlocks)+float64(tt.c.NewBlocks)+got.Requests+got.Affinity+got.Pressure+got.Queue, got.Cost, 1e-9)
		})
	}
}

func TestSharedPrefixAffinityScalesTheChargeForHotMissingBlocks(t *testing.T) {
	// R = 10 blocks; 6 of them are a prefix two requests on another worker are using.
	req := &Request{PromptTokens: 640, BlockSize: 64, Blocks: make([]uint64, 10), SharedPrefixBlocks: 6}
	cold := Candidate{Overlap: 0, HeldBlocks: 50, CapacityBlocks: 100}
	tests := []struct {
		name         string
		share        float64
		c            Candidate
		wantShared   int
		wantAffinity float64 // α = 2; pressure is β = 4 at half occupancy, 2 per charged block
	}{
		{"charged in full", 1, cold, 6, 2 * 10},
		{"not charged", 0, cold, 6, 2 * 4},
		{"half charged", 0.5, cold, 6, 2 * 7},
		{"a worker holding part of the shared prefix", 0, Candidate{Overlap: 4, HeldBlocks: 50, CapacityBlocks: 100}, 2, 2 * 4},
		{"the holder misses only private blocks", 0, Candidate{Overlap: 6, HeldBlocks: 50, CapacityBlocks: 100}, 0, 2 * 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Params{PrefixAffinityWeight: 2, CachePressureWeight: 4, SharedPrefixAffinity: tt.share}
			got := p.Cost(req, tt.c)
			assert.Equal(t, tt.wantShared, got.SharedMissing)
			assert.InDelta(t, tt.wantAffinity, got.Affinity, 1e-12)
			assert.InDelta(t, tt.wantAffinity, got.Pressure, 1e-12, "pressure charges the same blocks")
		})
	}
}

// sharedPrefixFleet is the pile-up of issue 11 in one decision: a 3,096-token first turn
// (R = 49) behind a 46-block system prompt that a busy holder's sessions are using.
func sharedPrefixFleet(holderActive, holderPending int) (*Request, []Candidate) {
	req := &Request{PromptTokens: 3096, BlockSize: 64, Blocks: make([]uint64, 48)}
	holder := Candidate{Worker: "holder", Overlap: 46, ActiveBlocks: 46 + 3*holderActive, NewBlocks: 2,
		ActiveRequests: holderActive, PendingRequests: holderPending, SharedBlocks: 46, MaxNumSeqs: 4,
		PrefillTokens: 152 * holderPending, HeldBlocks: 46 + 3*holderActive, CapacityBlocks: 16384}
	cold := Candidate{Worker: "cold", NewBlocks: 48, MaxNumSeqs: 4, CapacityBlocks: 16384}
	return req, []Candidate{holder, cold}
}

func TestBatchPressureSpreadsSessionsBehindASharedPrompt(t *testing.T) {
	tests := []struct {
		name                     string
		params                   Params
		holderActive, holderWait int
		want                     string
	}{
		{"previous default: a saturated holder still wins", withShare(withQueue(DefaultParams(), 0), 1), 6, 2, "holder"},
		{"default: an idle holder keeps the session (cache hit, no wait)", DefaultParams(), 1, 0, "holder"},
		{"default: a holder with two requests waiting loses it", DefaultParams(), 3, 2, "cold"},
		{"default: a holder with every batch slot busy loses it", DefaultParams(), 4, 0, "cold"},
		{"queue term alone is outweighed by the prefix affinity", withShare(DefaultParams(), 1), 4, 0, "holder"},
		{"Dynamo's cost keeps it on the holder, whose distinct blocks grow slowly", DynamoParams(), 3, 0, "holder"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			picker, err := NewKVCost(tt.params, rand.New(rand.NewPCG(1, 2)))
			require.NoError(t, err)
			req, cands := sharedPrefixFleet(tt.holderActive, tt.holderWait)
			d, err := picker.Pick(context.Background(), req, cands)
			require.NoError(t, err)
			assert.Equal(t, tt.want, d.Worker, "costs %v / %v", d.Terms[0].Cost, d.Terms[1].Cost)
			assert.Zero(t, req.SharedPrefixBlocks, "Pick prices a copy; the caller's request is unchanged")
			assert.Equal(t, 46, d.Terms[1].SharedMissing, "the trace shows the hot blocks the cold worker misses")
		})
	}
}

func TestSessionHistoryStillPinsASessionWhenNothingIsShared(t *testing.T) {
	// A resumed turn: its holder has its history cached but no active request shares it,
	// so the shared-prefix share does not apply and the session stays despite a busier
	// holder (one request in prefill there).
	req := &Request{PromptTokens: 3480, BlockSize: 64, Blocks: make([]uint64, 54)}
	holder := Candidate{Worker: "holder", Overlap: 52, ActiveBlocks: 120, NewBlocks: 54, ActiveRequests: 2, PendingRequests: 1,
		HeldBlocks: 300, CapacityBlocks: 512}
	other := Candidate{Worker: "other", ActiveBlocks: 60, NewBlocks: 54, ActiveRequests: 1, HeldBlocks: 300, CapacityBlocks: 512}
	picker, err := NewKVCost(DefaultParams(), rand.New(rand.NewPCG(1, 2)))
	require.NoError(t, err)
	d, err := picker.Pick(context.Background(), req, []Candidate{holder, other})
	require.NoError(t, err)
	assert.Equal(t, "holder", d.Worker)
	assert.Zero(t, d.Terms[1].SharedMissing)
}

func withQueue(p Params, q float64) Params { p.QueueWeight = q; return p }
func withShare(p Params, h float64) Params { p.SharedPrefixAffinity = h; return p }

func TestInterferenceChargesAPrefillForTheRequestsItSlows(t *testing.T) {
	// R = 10 blocks; ι = 0.5.
	p := Params{InterferenceWeight: 0.5}
	req := &Request{PromptTokens: 640, BlockSize: 64, Blocks: make([]uint64, 10)}
	tests := []struct {
		name string
		c    Candidate
		want float64
	}{
		{"idle worker: nothing to slow", Candidate{}, 0},
		{"cold worker running three requests: all 10 blocks slow them", Candidate{ActiveRequests: 3}, 0.5 * 3 * 10},
		{"holder of 8 blocks: only the 2 it computes", Candidate{ActiveRequests: 3, Overlap: 8}, 0.5 * 3 * 2},
		{"holder of the whole prompt", Candidate{ActiveRequests: 3, Overlap: 10}, 0},
		{"queued requests count: the worker is busy either way", Candidate{ActiveRequests: 3, PendingRequests: 3}, 0.5 * 3 * 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := p.Cost(req, tt.c)
			assert.InDelta(t, tt.want, got.Interference, 1e-12)
			assert.InDelta(t, got.Prefill+float64(tt.c.ActiveBlocks)+float64(tt.c.NewBlocks)+got.Requests+got.Affinity+got.Pressure+got.Queue+got.Interference, got.Cost, 1e-9)
		})
	}
	assert.Zero(t, DefaultParams().InterferenceWeight, "off unless configured")
}

func TestInterferenceSendsANewPromptAwayFromRunningRequests(t *testing.T) {
	// A cold prompt of 10 blocks. busy runs 4 requests in an empty cache; idle runs
	// none but its cache is a fifth full. Cache pressure (β) prefers busy's empty cache;
	// with ι = 1 the prefill's cost to busy's 4 running requests outweighs it.
	req := &Request{PromptTokens: 640, BlockSize: 64, Blocks: make([]uint64, 10)}
	candidates := []Candidate{
		{Worker: "busy", ActiveRequests: 4, ActiveBlocks: 40, CapacityBlocks: 100},
		{Worker: "idle", HeldBlocks: 20, CapacityBlocks: 100},
	}
	tests := []struct {
		interference float64
		want         string
	}{
		{0, "busy"},
		{1, "idle"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("interference_weight %v", tt.interference), func(t *testing.T) {
			params := DefaultParams()
			params.InterferenceWeight = tt.interference
			picker, err := NewKVCost(params, rand.New(rand.NewPCG(1, 2)))
			require.NoError(t, err)
			d, err := picker.Pick(context.Background(), req, candidates)
			require.NoError(t, err)
			assert.Equal(t, tt.want, d.Worker)
		})
	}
}
