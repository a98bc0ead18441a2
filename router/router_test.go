package router

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
)

type fixture struct {
	router   *Router
	index    *index.Index
	bookings *scoring.Bookings
}

func newFixture(t *testing.T, params scoring.Params, workers ...Worker) fixture {
	t.Helper()
	idx, err := index.New(index.Config{CapacityBlocks: 1000}, nil)
	require.NoError(t, err)
	for _, w := range workers {
		require.NoError(t, idx.SetWorker(w.Name, w.CapacityBlocks))
	}
	picker, err := scoring.NewKVCost(params, rand.New(rand.NewPCG(1, 1)))
	require.NoError(t, err)
	bookings := scoring.NewBookings()
	policy, err := scoring.NewPolicy(params)
	require.NoError(t, err)
	r, err := New(Config{BlockSize: 4, Workers: workers}, Deps{
		Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{},
		Index: idx, Bookings: bookings, Picker: picker, RecordBlocks: true, Policy: policy,
	})
	require.NoError(t, err)
	return fixture{router: r, index: idx, bookings: bookings}
}

func twoWorkers() []Worker {
	return []Worker{{Name: "a", Address: "127.0.0.1:8001"}, {Name: "b", Address: "127.0.0.1:8002"}}
}

func tokens(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func TestResumedConversationReturnsToItsHolder(t *testing.T) {
	f := newFixture(t, scoring.DynamoParams(), twoWorkers()...)
	ctx := context.Background()
	history := tokenize.TextChat("system", strings.Repeat("You are a careful assistant. ", 20), "user", "first question")

	first, err := f.router.Route(ctx, &Request{Model: "m", Chat: history})
	require.NoError(t, err)
	first.FirstToken()
	require.True(t, first.Release())

	history.Messages = append(history.Messages, tokenize.TextMessage("assistant", "an answer"), tokenize.TextMessage("user", "a follow-up"))
	second, err := f.router.Route(ctx, &Request{Model: "m", Chat: history})
	require.NoError(t, err)
	defer second.Release()
	assert.Equal(t, first.Worker, second.Worker)
	assert.Greater(t, second.PredictedCachedTokens, 0)
	assert.Equal(t, second.Terms[second.Chosen].Overlap*4, second.PredictedCachedTokens)
}

func TestRouteBooksAndReleasesExactlyOnce(t *testing.T) {
	f := newFixture(t, scoring.DynamoParams(), twoWorkers()...)
	d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 10)})
	require.NoError(t, err)
	assert.Equal(t, scoring.Load{PrefillTokens: 10, ActiveBlocks: 2, ActiveRequests: 1, PendingRequests: 1}, f.bookings.Load(d.Worker))
	d.FirstToken()
	assert.Equal(t, scoring.Load{ActiveBlocks: 2, ActiveRequests: 1}, f.bookings.Load(d.Worker))
	assert.True(t, d.Release())
	assert.False(t, d.Release())
	assert.Equal(t, scoring.Load{}, f.bookings.Load(d.Worker))
	assert.Equal(t, 2, f.index.WorkerEntries(d.Worker), "approximate mode recorded the blocks")
	assert.Equal(t, 10, d.PromptTokens)
	assert.Equal(t, 2, d.Blocks)
}

func TestServedMovesTheRequestToTheFallbackOnce(t *testing.T) {
	f := newFixture(t, scoring.DynamoParams(), twoWorkers()...)
	ctx := context.Background()
	// The holder has the prompt's first 8 blocks, the other worker its first 4: as the
	// fallback, the other computes the rest of the prompt.
	warm, err := f.router.Route(ctx, &Request{Model: "m", Tokens: tokens(0, 32)})
	require.NoError(t, err)
	warm.Release()
	holder, other := warm.Worker, otherThan(warm.Worker)
	require.NoError(t, f.index.Store(other, warm.blocks[:4]))

	d, err := f.router.Route(ctx, &Request{Model: "m", Tokens: tokens(0, 40)})
	require.NoError(t, err)
	require.Equal(t, holder, d.Worker)
	require.Equal(t, 10, f.index.WorkerEntries(holder))

	tests := []struct {
		name    string
		address string
		want    string
		moved   bool
	}{
		{"an address the decision did not list", "10.0.0.9:8000", "", false},
		{"the chosen worker itself", d.Address, "", false},
		{"the fallback", d.FallbackAddresses[0], other, true},
		{"a second report", d.FallbackAddresses[0], "", false},
	}
	for _, tt := range tests {
		worker, moved, err := d.Served(tt.address)
		require.NoError(t, err, tt.name)
		assert.Equal(t, tt.want, worker, tt.name)
		assert.Equal(t, tt.moved, moved, tt.name)
	}
	assert.Equal(t, other, d.ServedWorker())
	assert.Equal(t, holder, d.Worker, "the decision's trace still names its choice")
	assert.Equal(t, scoring.Load{}, f.bookings.Load(holder))
	assert.Equal(t, scoring.Load{PrefillTokens: 40 - 4*4, ActiveBlocks: 10, ActiveRequests: 1, PendingRequests: 1}, f.bookings.Load(other),
		"the fallback computes what it does not hold")
	assert.Equal(t, 8, f.index.WorkerEntries(holder), "the holder keeps the 8 blocks it computed, not the 2 it never did")
	assert.Equal(t, 10, f.index.WorkerEntries(other))

	require.True(t, d.Release())
	assert.Equal(t, scoring.Load{}, f.bookings.Load(other))
	_, moved, _ := d.Served(d.FallbackAddresses[0])
	assert.False(t, moved, "a released request does not move")
}

func TestRouteSpreadsConcurrentLoad(t *testing.T) {
	// With bookings, a second identical-size cold request sees the first one's load.
	f := newFixture(t, scoring.DynamoParams(), twoWorkers()...)
	d1, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40)})
	require.NoError(t, err)
	d2, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(1000, 40)})
	require.NoError(t, err)
	assert.NotEqual(t, d1.Worker, d2.Worker)
	assert.Equal(t, []string{d1.Address}, d2.FallbackAddresses)
}

func TestAWorkerWithEveryBatchSlotBusyLosesTheNextRequest(t *testing.T) {
	// Both workers have 2 batch slots; a's are busy decoding one shared prompt (first
	// tokens out), b is idle. The next request extends that prompt, yet waiting for a
	// slot on a costs more than recomputing the prompt on b.
	workers := twoWorkers()
	workers[0].MaxNumSeqs, workers[1].MaxNumSeqs = 2, 2
	f := newFixture(t, scoring.DefaultParams(), workers...)
	ctx := context.Background()
	prompt := tokens(0, 40) // 10 blocks of 4 tokens
	for range 2 {
		d, err := f.router.Route(ctx, &Request{Model: "m", Tokens: prompt, Subset: []string{workers[0].Address}})
		require.NoError(t, err)
		d.FirstToken()
		t.Cleanup(func() { d.Release() })
	}
	next := &Request{Model: "m", Tokens: append(append([]uint32(nil), prompt...), tokens(500, 8)...)}

	withoutBatchPressure := scoring.DefaultParams()
	withoutBatchPressure.QueueWeight, withoutBatchPressure.SharedPrefixAffinity = 0, 1
	next.Params = &withoutBatchPressure
	d, err := f.router.Route(ctx, next)
	require.NoError(t, err)
	assert.Equal(t, "a", d.Worker, "the cache alone keeps it on the busy holder")
	d.Release()

	next.Params = nil
	d, err = f.router.Route(ctx, next)
	require.NoError(t, err)
	defer d.Release()
	assert.Equal(t, "b", d.Worker)
	a := d.Terms[0]
	assert.Equal(t, 2, a.MaxNumSeqs, "the worker's max_num_seqs reaches the cost")
	assert.Equal(t, 1, a.Queued, "this request would wait for a's next free slot")
	assert.Equal(t, 10, a.SharedBlocks, "two active requests share the prompt's blocks on a")
	assert.Equal(t, 10, d.Terms[1].SharedMissing, "so b is not charged affinity for them")
}

func TestRouteErrors(t *testing.T) {
	workers := []Worker{
		{Name: "a", Address: "127.0.0.1:8001", Models: []string{"llama"}},
		{Name: "b", Address: "127.0.0.1:8002", Models: []string{"qwen"}},
	}
	bad := scoring.DynamoParams()
	bad.PrefixAffinityWeight = -1
	tests := []struct {
		name    string
		req     Request
		want    error
		worker  string
		wantErr bool
	}{
		{name: "model restricts the candidates", req: Request{Model: "qwen", Prompt: "hi there"}, worker: "b"},
		{name: "model no worker serves", req: Request{Model: "gpt", Prompt: "hi"}, want: ErrModelNotFound},
		{name: "subset excludes every server of the model", req: Request{Model: "qwen", Prompt: "hi", Subset: []string{"127.0.0.1:8001"}}, want: ErrNoWorkers},
		{name: "subset keeps one", req: Request{Model: "llama", Prompt: "hi", Subset: []string{"127.0.0.1:8001", "10.0.0.9:1"}}, worker: "a"},
		{name: "invalid override", req: Request{Model: "llama", Prompt: "hi", Params: &bad}, want: ErrBadRequest},
		{name: "empty chat", req: Request{Model: "llama", Chat: &tokenize.Chat{}}, want: ErrBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, scoring.DynamoParams(), workers...)
			d, err := f.router.Route(context.Background(), &tt.req)
			if tt.want != nil {
				assert.ErrorIs(t, err, tt.want)
				for _, w := range []string{"a", "b"} {
					assert.Equal(t, scoring.Load{}, f.bookings.Load(w), "a failed route books nothing")
				}
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.worker, d.Worker)
			d.Release()
		})
	}
}

// A subset hint entry without a port names a pod, not one of its ports: GIE's
// reference picker admits every endpoint at that IP (pkg/lwepp/handlers/request.go),
// and the conformance test of multi-port pools sends bare IPs beside ip:port entries
// (conformance/tests/gateway_following_epp_routing_dp.go). kvroute matched whole
// addresses only, so a bare IP admitted no worker (503).
func TestSubsetEntryWithoutPortAdmitsEveryPortOfThatIP(t *testing.T) {
	workers := []Worker{
		{Name: "a0", Address: "10.0.0.1:8000"}, {Name: "a1", Address: "10.0.0.1:8001"},
		{Name: "b0", Address: "10.0.0.2:8000"}, {Name: "b1", Address: "10.0.0.2:8001"},
		{Name: "v6", Address: "[2001:db8::1]:8000"},
	}
	tests := []struct {
		subset []string
		want   []string
	}{
		{subset: []string{"10.0.0.2"}, want: []string{"b0", "b1"}},
		{subset: []string{"10.0.0.1", "10.0.0.2:8001"}, want: []string{"a0", "a1", "b1"}},
		{subset: []string{"2001:db8::1"}, want: []string{"v6"}},
		{subset: []string{"10.0.0.1:8001"}, want: []string{"a1"}},
		{subset: []string{"10.0.0.3"}, want: nil},
	}
	for _, tt := range tests {
		f := newFixture(t, scoring.DynamoParams(), workers...)
		seen := map[string]bool{}
		for i := range 40 {
			d, err := f.router.Route(context.Background(), &Request{Tokens: tokens(100*i, 8), AnyModel: true, Subset: tt.subset})
			if tt.want == nil {
				require.ErrorIs(t, err, ErrNoWorkers, "subset %q", tt.subset)
				break
			}
			require.NoError(t, err, "subset %q", tt.subset)
			require.Contains(t, tt.want, d.Worker, "subset %q", tt.subset)
			seen[d.Worker] = true
			d.Release()
		}
		if tt.want != nil {
			assert.Len(t, seen, len(tt.want), "subset %q: every admitted worker is a candidate", tt.subset)
		}
	}
}

// A discovered fleet can be empty (a pool scaled to zero, every pod unready): that is
// "no worker now" (503), not "no worker serves the model" (404).
func TestAnEmptyFleetIsNoWorkersNotModelNotFound(t *testing.T) {
	f := newFixture(t, scoring.DynamoParams())
	_, err := f.router.Route(context.Background(), &Request{Model: "qwen", Prompt: "hi"})
	assert.ErrorIs(t, err, ErrNoWorkers)
}

func TestConfigValidateNamesTheField(t *testing.T) {
	ok := Worker{Name: "a", Address: "127.0.0.1:1"}
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"zero block size", Config{BlockSize: 0}, "block_size"},
		{"empty name", Config{BlockSize: 4, Workers: []Worker{{Address: "127.0.0.1:1"}}}, "workers[0].name"},
		{"duplicate name", Config{BlockSize: 4, Workers: []Worker{ok, {Name: "a", Address: "127.0.0.1:2"}}}, "workers[1].name"},
		{"host name address", Config{BlockSize: 4, Workers: []Worker{{Name: "a", Address: "vllm:8000"}}}, "workers[0].address"},
		{"no port", Config{BlockSize: 4, Workers: []Worker{{Name: "a", Address: "127.0.0.1"}}}, "workers[0].address"},
		{"duplicate address", Config{BlockSize: 4, Workers: []Worker{ok, {Name: "b", Address: "127.0.0.1:1"}}}, "workers[1].address"},
		{"negative capacity", Config{BlockSize: 4, Workers: []Worker{{Name: "a", Address: "[::1]:80", CapacityBlocks: -1}}}, "workers[0].capacity_blocks"},
		{"negative batch slots", Config{BlockSize: 4, Workers: []Worker{ok, {Name: "b", Address: "[::1]:80", MaxNumSeqs: -4}}}, "workers[1].max_num_seqs"},
		{"empty model", Config{BlockSize: 4, Workers: []Worker{{Name: "a", Address: "[::1]:80", Models: []string{""}}}}, "workers[0].models[0]"},
		{"adapter without name", Config{BlockSize: 4, LoRAAdapters: []LoRAAdapter{{BaseModel: "qwen"}}}, "lora_adapters[0].name"},
		{"adapter without base", Config{BlockSize: 4, LoRAAdapters: []LoRAAdapter{{Name: "sql"}}}, "lora_adapters[0].base_model"},
		{"adapter declared twice", Config{BlockSize: 4, LoRAAdapters: []LoRAAdapter{{Name: "sql", BaseModel: "qwen"}, {Name: "sql", BaseModel: "llama"}}}, "lora_adapters[1].name"},
		{"adapter on itself", Config{BlockSize: 4, LoRAAdapters: []LoRAAdapter{{Name: "sql", BaseModel: "sql"}}}, "lora_adapters[0].base_model"},
		{"adapter on an adapter", Config{BlockSize: 4, LoRAAdapters: []LoRAAdapter{{Name: "sql", BaseModel: "qwen"}, {Name: "sql-v2", BaseModel: "sql"}}}, "lora_adapters[1].base_model"},
		{"negative max_loras", Config{BlockSize: 4, Workers: []Worker{{Name: "a", Address: "[::1]:80", MaxLoRAs: -1}}}, "workers[0].max_loras"},
		{"negative residency", Config{BlockSize: 4, LoRAResidency: -time.Second}, "lora_residency"},
		{"residency over an hour", Config{BlockSize: 4, LoRAResidency: 2 * time.Hour}, "lora_residency"},
		{"too many adapters", Config{BlockSize: 4, LoRAAdapters: make([]LoRAAdapter, maxLoRAAdapters+1)}, "lora_adapters"},
		{"unknown role", Config{BlockSize: 4, Workers: []Worker{ok, {Name: "b", Address: "[::1]:80", Role: "encode"}}}, "workers[1].role"},
		{"unknown protocol", Config{BlockSize: 4, Workers: []Worker{ok, {Name: "b", Address: "[::1]:80", Protocol: "h2"}}}, "workers[1].protocol"},
		{"appProtocol's spelling", Config{BlockSize: 4, Workers: []Worker{{Name: "a", Address: "[::1]:80", Protocol: "kubernetes.io/h2c"}}}, "workers[0].protocol"},
		{"worker lists an adapter", Config{BlockSize: 4, LoRAAdapters: []LoRAAdapter{{Name: "sql", BaseModel: "qwen"}},
			Workers: []Worker{{Name: "a", Address: "[::1]:80", Models: []string{"qwen", "sql"}}}}, "workers[0].models[1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			require.Error(t, err)
			assert.True(t, strings.HasPrefix(err.Error(), tt.want+":"), err.Error())
		})
	}
}

func TestConcurrentRoutesLeaveNoLoadBehind(t *testing.T) {
	var workers []Worker
	for i := range 4 {
		workers = append(workers, Worker{Name: fmt.Sprint("w", i), Address: fmt.Sprintf("127.0.0.1:%d", 9000+i)})
	}
	f := newFixture(t, scoring.DynamoParams(), workers...)
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			for i := range 200 {
				d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens((g*7+i)%13*100, 37)})
				if !assert.NoError(t, err) {
					return
				}
				if i%2 == 0 {
					d.FirstToken()
				}
				d.Release()
			}
		})
	}
	wg.Wait()
	for _, w := range workers {
		assert.Equal(t, scoring.Load{}, f.bookings.Load(w.Name))
	}
}

// outSet is an Eligibility that leaves out the named workers.
type outSet map[string]bool

func (o outSet) Eligible(worker string) bool { return !o[worker] }

func TestRouteLeavesOutWorkersOutForHealth(t *testing.T) {
	f := newFixture(t, scoring.DefaultParams(), twoWorkers()...)
	ctx := context.Background()
	prompt := tokens(0, 40)
	first, err := f.router.Route(ctx, &Request{Model: "m", Tokens: prompt})
	require.NoError(t, err)
	first.Release()

	tests := []struct {
		name       string
		out        outSet
		wantWorker string // "" means the holder
		wantAllOut bool
	}{
		{"healthy fleet keeps the session on its holder", outSet{}, "", false},
		{"every worker out: route among all rather than refuse", outSet{"a": true, "b": true}, "", true},
		// Last: it records the session on the other worker too.
		{"the holder out: the session goes elsewhere", outSet{first.Worker: true}, otherThan(first.Worker), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f.router.deps.Health = tt.out
			d, err := f.router.Route(ctx, &Request{Model: "m", Tokens: prompt})
			require.NoError(t, err)
			defer d.Release()
			want := tt.wantWorker
			if want == "" {
				want = first.Worker
			}
			assert.Equal(t, want, d.Worker)
			assert.Equal(t, tt.wantAllOut, d.AllOut)
			if !tt.wantAllOut && len(tt.out) > 0 {
				assert.Empty(t, d.FallbackAddresses, "a worker that is out is not a fallback either")
			}
		})
	}
}

func otherThan(worker string) string {
	if worker == "a" {
		return "b"
	}
	return "a"
}

// A worker whose address changes is another engine, with an empty cache. The router
// clears it between two decisions, and a decision that read its candidates before the
// change (so chose the old address) records nothing on it. When the fleet cleared the
// index itself before the swap, such a decision credited the new engine with blocks
// only the old one computed.
func TestAMovedWorkerIsNeverCreditedWithItsOldEnginesBlocks(t *testing.T) {
	old := Worker{Name: "a", Address: "127.0.0.1:8001"}
	moved := Worker{Name: "a", Address: "127.0.0.1:9001"}
	tests := []struct {
		name string
		// during runs inside the decision, after its candidates were read; nil: no change.
		during      func(f fixture)
		wantAddress string
		wantEntries int
	}{
		{"no change: the decision's blocks are recorded", nil, old.Address, 10},
		{"moved mid-decision: nothing recorded on the new engine", func(f fixture) {
			require.NoError(t, f.router.SetWorkers([]Worker{moved}))
		}, old.Address, 0},
		{"capacity changed mid-decision: same engine, recorded", func(f fixture) {
			require.NoError(t, f.router.SetWorkers([]Worker{{Name: "a", Address: old.Address, CapacityBlocks: 500}}))
		}, old.Address, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, scoring.DefaultParams(), old)
			if tt.during != nil {
				f.router.deps.Signals = &fleetChange{once: func() { tt.during(f) }}
			}
			d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40)})
			require.NoError(t, err)
			d.Release()
			assert.Equal(t, tt.wantAddress, d.Address, "the decision stands")
			assert.Equal(t, tt.wantEntries, f.index.WorkerEntries("a"))
		})
	}

	t.Run("a worker that moves between decisions is cleared", func(t *testing.T) {
		f := newFixture(t, scoring.DefaultParams(), old)
		d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40)})
		require.NoError(t, err)
		d.Release()
		require.NoError(t, f.router.SetWorkers([]Worker{{Name: "a", Address: old.Address, MaxNumSeqs: 8}}))
		assert.Equal(t, 10, f.index.WorkerEntries("a"), "same address, same engine: kept")
		require.NoError(t, f.router.SetWorkers([]Worker{moved}))
		assert.Zero(t, f.index.WorkerEntries("a"))
	})
}

func TestSetWorkersReplacesTheFleet(t *testing.T) {
	f := newFixture(t, scoring.DefaultParams(), twoWorkers()...)
	require.NoError(t, f.index.SetWorker("c", 0))
	require.NoError(t, f.router.SetWorkers([]Worker{{Name: "c", Address: "127.0.0.1:8003"}}))
	d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40)})
	require.NoError(t, err)
	defer d.Release()
	assert.Equal(t, "c", d.Worker)
	assert.Equal(t, []Worker{{Name: "c", Address: "127.0.0.1:8003"}}, f.router.Workers())

	err = f.router.SetWorkers([]Worker{{Name: "d", Address: "localhost:1"}})
	assert.ErrorContains(t, err, "workers[0].address")
	assert.Equal(t, "c", f.router.Workers()[0].Name, "a bad list changes nothing")
}

func TestAWorkerRemovedFromTheIndexMidDecisionStillGetsTheRequest(t *testing.T) {
	// A reload removes a worker from the index right after the router chose it.
	f := newFixture(t, scoring.DefaultParams(), Worker{Name: "a", Address: "127.0.0.1:8001"})
	f.index.RemoveWorker("a")
	d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40)})
	require.NoError(t, err, "the request is not failed for a reload's sake")
	assert.Equal(t, "a", d.Worker)
	assert.True(t, d.Release())
}

func TestSheddingLeavesFullWorkersOutAndRefusesWhenAllAreFull(t *testing.T) {
	idx, err := index.New(index.Config{CapacityBlocks: 1000}, nil)
	require.NoError(t, err)
	workers := twoWorkers()
	for _, w := range workers {
		require.NoError(t, idx.SetWorker(w.Name, 0))
	}
	picker, err := scoring.NewKVCost(scoring.DefaultParams(), rand.New(rand.NewPCG(1, 1)))
	require.NoError(t, err)
	r, err := New(Config{BlockSize: 4, Workers: workers, MaxActiveRequestsPerWorker: 1}, Deps{
		Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}, Index: idx, Bookings: scoring.NewBookings(), Picker: picker, RecordBlocks: true,
	})
	require.NoError(t, err)
	ctx := context.Background()
	prompt := tokens(0, 40)

	first, err := r.Route(ctx, &Request{Model: "m", Tokens: prompt})
	require.NoError(t, err)
	second, err := r.Route(ctx, &Request{Model: "m", Tokens: prompt})
	require.NoError(t, err)
	assert.NotEqual(t, first.Worker, second.Worker, "the prefix's holder is full: the other worker takes it")
	_, err = r.Route(ctx, &Request{Model: "m", Tokens: prompt})
	assert.ErrorIs(t, err, ErrOverloaded, "every worker at its limit")

	require.True(t, first.Release())
	third, err := r.Route(ctx, &Request{Model: "m", Tokens: prompt})
	require.NoError(t, err, "a released slot takes requests again")
	assert.Equal(t, first.Worker, third.Worker)
	third.Release()
	second.Release()

	_, err = New(Config{BlockSize: 4, Workers: workers, MaxActiveRequestsPerWorker: -1}, Deps{})
	assert.ErrorContains(t, err, "max_active_requests_per_worker")
}
