package router

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
)

// fakeLists is engine model lists: worker → adapter → base model, where a name
// mapped to "" is a base model the engine serves; a worker absent from it has no
// known list.
type fakeLists map[string]map[string]string

func (f fakeLists) ServesModel(worker, model string) (bool, bool) {
	list, known := f[worker]
	base, listed := list[model]
	return listed && base == "", known
}

func (f fakeLists) ServesAdapter(worker, adapter string) (bool, bool) {
	list, known := f[worker]
	base, listed := list[adapter]
	return listed && base != "", known
}

// BaseOf leaves out a name some list gives as a base model, as enginemodels does.
func (f fakeLists) BaseOf(adapter string) (string, bool) {
	found := ""
	for _, list := range f {
		base, ok := list[adapter]
		switch {
		case ok && base == "":
			return "", false
		case ok:
			found = base
		}
	}
	return found, found != ""
}

// listsRouter is a router over cfg's workers (block size 4) with the engine lists and
// health given (either may be nil), the default cost, and an index recording its
// decisions.
func listsRouter(t *testing.T, cfg Config, lists ModelLists, health Eligibility) *Router {
	t.Helper()
	idx, err := index.New(index.Config{CapacityBlocks: 1000}, nil)
	require.NoError(t, err)
	for _, w := range cfg.Workers {
		require.NoError(t, idx.SetWorker(w.Name, 0))
	}
	picker, err := scoring.NewKVCost(scoring.DefaultParams(), rand.New(rand.NewPCG(1, 1)))
	require.NoError(t, err)
	cfg.BlockSize = 4
	r, err := New(cfg, Deps{Tokenizers: OneTokenizer(tokenize.Pipeline{Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}}),
		Index: idx, Bookings: scoring.NewBookings(), Picker: picker, RecordBlocks: true, ModelLists: lists, Health: health})
	require.NoError(t, err)
	return r
}

// An adapter request goes only to the workers that may serve its adapter: a worker's
// own lora_adapters, else its engine's list; a worker whose list is unknown may. When
// no worker of the base model lists it, every one is a candidate and the decision says
// so (the engines may load it on demand). Whatever the load, a worker known not to
// serve the adapter is never picked: vLLM would answer 404.
func TestAdapterRequestsGoOnlyToWorkersThatServeTheAdapter(t *testing.T) {
	q := func(name, port string, own ...string) Worker {
		return Worker{Name: name, Address: "127.0.0.1:" + port, Models: []string{"qwen"}, LoRAAdapters: own}
	}
	declared := []LoRAAdapter{{Name: "sql", BaseModel: "qwen"}, {Name: "chat", BaseModel: "qwen"}}
	tests := []struct {
		name         string
		workers      []Worker
		adapters     []LoRAAdapter
		lists        fakeLists
		model        string
		wantWorkers  []string // every worker the requests went to
		wantUnlisted bool
		wantLoRA     string
	}{
		{name: "engine lists", workers: []Worker{q("a", "8001"), q("b", "8002"), q("c", "8003")}, adapters: declared,
			lists: fakeLists{"a": {"chat": "qwen"}, "b": {"sql": "qwen"}, "c": {"chat": "qwen"}}, model: "sql",
			wantWorkers: []string{"b"}, wantLoRA: "sql"},
		{name: "an unknown list may serve it", workers: []Worker{q("a", "8001"), q("b", "8002"), q("c", "8003")}, adapters: declared,
			lists: fakeLists{"a": {"chat": "qwen"}, "b": {"sql": "qwen"}}, model: "sql",
			wantWorkers: []string{"b", "c"}, wantLoRA: "sql"},
		{name: "a worker's own list wins over its engine's", workers: []Worker{q("a", "8001", "sql"), q("b", "8002", "chat"), q("c", "8003")}, adapters: declared,
			lists: fakeLists{"a": {}, "b": {"sql": "qwen"}, "c": {"chat": "qwen"}}, model: "sql",
			wantWorkers: []string{"a"}, wantLoRA: "sql"},
		{name: "own lists without engine lists", workers: []Worker{q("a", "8001", "sql"), q("b", "8002", "chat"), q("c", "8003", "chat", "sql")}, adapters: declared,
			model: "sql", wantWorkers: []string{"a", "c"}, wantLoRA: "sql"},
		{name: "listed nowhere: every worker of the base model", workers: []Worker{q("a", "8001"), q("b", "8002")}, adapters: declared,
			lists: fakeLists{"a": {"chat": "qwen"}, "b": {}}, model: "sql",
			wantWorkers: []string{"a", "b"}, wantUnlisted: true, wantLoRA: "sql"},
		{name: "an undeclared adapter an engine lists", workers: []Worker{q("a", "8001"), q("b", "8002")},
			lists: fakeLists{"a": {"tools": "qwen"}, "b": {}}, model: "tools",
			wantWorkers: []string{"a"}, wantLoRA: "tools"},
		{name: "base-model requests ignore the lists", workers: []Worker{q("a", "8001"), q("b", "8002")}, adapters: declared,
			lists: fakeLists{"a": {"sql": "qwen"}, "b": {}}, model: "qwen",
			wantWorkers: []string{"a", "b"}},
	}
	prompts := []string{"first", "second", "third", "fourth", "fifth", "sixth"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var lists ModelLists
			if tt.lists != nil {
				lists = tt.lists
			}
			r := listsRouter(t, Config{Workers: tt.workers, LoRAAdapters: tt.adapters}, lists, nil)
			went := map[string]bool{}
			var held []*Decision
			// Distinct prompts, each held in flight, spread the requests by load over
			// every candidate.
			for _, p := range prompts {
				d, err := r.Route(context.Background(), &Request{Model: tt.model, Prompt: strings.Repeat(p+" prompt words ", 20)})
				require.NoError(t, err)
				held = append(held, d)
				went[d.Worker] = true
				assert.Equal(t, tt.wantUnlisted, d.LoRAUnlisted)
				assert.Equal(t, tt.wantLoRA, d.LoRA)
				assert.Equal(t, "qwen", d.Model)
			}
			for _, d := range held {
				d.Release()
			}
			var got []string
			for _, w := range tt.workers {
				if went[w.Name] {
					got = append(got, w.Name)
				}
			}
			assert.Equal(t, tt.wantWorkers, got)
		})
	}
}

// A worker configured without models serves what its engine lists: a request for a
// model goes only to such workers whose engines list it (or whose lists are unknown),
// next to the workers configured with it. The lists never refuse a request: when no
// destination the request can reach lists its model, every worker configured without
// models takes it, as without lists, and the decision says so.
func TestModelRequestsGoOnlyToWorkersWhoseEnginesListTheModel(t *testing.T) {
	open := func(name, port string, own ...string) Worker {
		return Worker{Name: name, Address: "127.0.0.1:" + port, LoRAAdapters: own}
	}
	qwenOnly := Worker{Name: "q", Address: "127.0.0.1:8009", Models: []string{"qwen"}}
	tests := []struct {
		name          string
		workers       []Worker
		lists         fakeLists
		adapters      []LoRAAdapter
		onDemand      bool
		model         string
		subset        []string
		out           Eligibility
		wantWorkers   []string
		wantUnlisted  bool // ModelUnlisted
		wantLoRALeft  bool // LoRAUnlisted
		wantModelSent string
	}{
		{name: "each model to the engines that list it", workers: []Worker{open("a", "8001"), open("b", "8002"), open("c", "8003")},
			lists: fakeLists{"a": {"qwen": ""}, "b": {"llama": ""}, "c": {"qwen": "", "qwen-fast": ""}}, model: "qwen",
			wantWorkers: []string{"a", "c"}},
		{name: "an unknown list may serve it", workers: []Worker{open("a", "8001"), open("b", "8002"), open("c", "8003")},
			lists: fakeLists{"a": {"qwen": ""}, "b": {"llama": ""}}, model: "llama",
			wantWorkers: []string{"b", "c"}},
		{name: "a configured worker is not narrowed", workers: []Worker{open("a", "8001"), qwenOnly},
			lists: fakeLists{"a": {"llama": ""}, "q": {"llama": ""}}, model: "qwen",
			wantWorkers: []string{"q"}},
		{name: "listed nowhere: every worker without models", workers: []Worker{open("a", "8001"), open("b", "8002")},
			lists: fakeLists{"a": {"qwen": ""}, "b": {"llama": ""}}, model: "mistral",
			wantWorkers: []string{"a", "b"}, wantUnlisted: true},
		{name: "the subset leaves out the worker that lists it", workers: []Worker{open("a", "8001"), open("b", "8002")},
			lists: fakeLists{"a": {"qwen": ""}, "b": {"llama": ""}}, model: "qwen", subset: []string{"127.0.0.1:8002"},
			wantWorkers: []string{"b"}, wantUnlisted: true},
		{name: "an adapter listed as a base model's name is not a base model", workers: []Worker{open("a", "8001"), open("b", "8002")},
			lists: fakeLists{"a": {"qwen": "", "sql": "qwen"}, "b": {"llama": "", "qwen": "llama"}}, model: "qwen",
			wantWorkers: []string{"a"}},
		{name: "own lora_adapters do not keep a worker out of the fallback", workers: []Worker{open("a", "8001", "sql"), open("b", "8002")},
			adapters: []LoRAAdapter{{Name: "sql", BaseModel: "qwen"}},
			lists:    fakeLists{"a": {"llama": ""}, "b": {"llama": ""}}, model: "qwen",
			wantWorkers: []string{"a", "b"}, wantUnlisted: true},
		{name: "an unknown list does not take what no list names", workers: []Worker{open("a", "8001"), open("b", "8002"), open("c", "8003")},
			lists: fakeLists{"a": {"mock": ""}, "b": {"mock": ""}}, model: "qwen",
			wantWorkers: []string{"a", "b", "c"}, wantUnlisted: true},
		{name: "an unknown list's worker out: the others take it", workers: []Worker{open("a", "8001"), open("b", "8002"), open("c", "8003")},
			lists: fakeLists{"a": {"mock": ""}, "b": {"mock": ""}}, out: outSet{"c": true}, model: "qwen",
			wantWorkers: []string{"a", "b"}, wantUnlisted: true},
		{name: "an unknown list still may serve a listed model", workers: []Worker{open("a", "8001"), open("b", "8002"), open("c", "8003")},
			lists: fakeLists{"a": {"qwen": ""}, "b": {"llama": ""}}, model: "qwen",
			wantWorkers: []string{"a", "c"}},
		{name: "an adapter no engine lists: to the engines of its base model", workers: []Worker{open("a", "8001"), open("b", "8002")},
			adapters: []LoRAAdapter{{Name: "sql", BaseModel: "qwen"}},
			lists:    fakeLists{"a": {"qwen": ""}, "b": {"llama": ""}}, model: "sql",
			wantWorkers: []string{"a"}, wantLoRALeft: true, wantModelSent: "qwen"},
		{name: "an adapter only an unknown list may serve: every engine of its base model", workers: []Worker{open("a", "8001"), open("b", "8002"), open("c", "8003")},
			adapters: []LoRAAdapter{{Name: "sql", BaseModel: "qwen"}},
			lists:    fakeLists{"a": {"qwen": ""}, "b": {"qwen": ""}}, model: "sql",
			wantWorkers: []string{"a", "b", "c"}, wantLoRALeft: true, wantModelSent: "qwen"},
		{name: "on demand: an adapter goes to the engines of its base model", workers: []Worker{open("a", "8001"), open("b", "8002")},
			adapters: []LoRAAdapter{{Name: "sql", BaseModel: "qwen"}}, onDemand: true,
			lists: fakeLists{"a": {"qwen": ""}, "b": {"llama": ""}}, model: "sql",
			wantWorkers: []string{"a"}, wantModelSent: "qwen"},
		{name: "on demand: its base model listed nowhere", workers: []Worker{open("a", "8001"), open("b", "8002")},
			adapters: []LoRAAdapter{{Name: "sql", BaseModel: "qwen"}}, onDemand: true,
			lists: fakeLists{"a": {"llama": ""}, "b": {"llama": ""}}, model: "sql",
			wantWorkers: []string{"a", "b"}, wantUnlisted: true, wantModelSent: "qwen"},
	}
	prompts := []string{"first", "second", "third", "fourth", "fifth", "sixth"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := listsRouter(t, Config{Workers: tt.workers, LoRAAdapters: tt.adapters, LoRAOnDemand: tt.onDemand}, tt.lists, tt.out)
			went := map[string]bool{}
			// Distinct prompts, each held in flight, spread the requests by load over
			// every candidate.
			for _, p := range prompts {
				d, err := r.Route(context.Background(), &Request{Model: tt.model, Prompt: strings.Repeat(p+" prompt words ", 20), Subset: tt.subset})
				require.NoError(t, err)
				defer d.Release()
				went[d.Worker] = true
				assert.Equal(t, tt.wantUnlisted, d.ModelUnlisted, "ModelUnlisted")
				assert.Equal(t, tt.wantLoRALeft, d.LoRAUnlisted, "LoRAUnlisted")
				if tt.wantModelSent != "" {
					assert.Equal(t, tt.wantModelSent, d.Model)
				}
			}
			var got []string
			for _, w := range tt.workers {
				if went[w.Name] {
					got = append(got, w.Name)
				}
			}
			assert.Equal(t, tt.wantWorkers, got)
		})
	}
}

// A name the config's workers serve as a model is routed as that model even when an
// engine lists an adapter of the same name.
func TestAnEngineListedAdapterDoesNotShadowAServedModel(t *testing.T) {
	workers := []Worker{{Name: "a", Address: "127.0.0.1:8001", Models: []string{"qwen"}}, {Name: "b", Address: "127.0.0.1:8002", Models: []string{"llama"}}}
	r := listsRouter(t, Config{Workers: workers}, fakeLists{"a": {"llama": "qwen"}}, nil)
	d, err := r.Route(context.Background(), &Request{Model: "llama", Prompt: "hello there"})
	require.NoError(t, err)
	defer d.Release()
	assert.Equal(t, "b", d.Worker)
	assert.Empty(t, d.LoRA)
}

// Disaggregated: the prefill worker must hold the adapter too, or it could not compute
// the adapter's KV; without one that does, the destination prefills.
func TestAnAdapterRequestsPrefillWorkerServesTheAdapter(t *testing.T) {
	workers := []Worker{
		{Name: "d0", Address: "127.0.0.1:8001", Role: RoleDecode},
		{Name: "p0", Address: "127.0.0.1:8002", Role: RolePrefill},
		{Name: "p1", Address: "127.0.0.1:8003", Role: RolePrefill},
	}
	declared := []LoRAAdapter{{Name: "sql", BaseModel: "qwen"}}
	for _, tt := range []struct {
		name        string
		lists       fakeLists
		wantPrefill string
	}{
		{"the one prefill worker with it", fakeLists{"d0": {"qwen": "", "sql": "qwen"}, "p0": {"qwen": ""}, "p1": {"qwen": "", "sql": "qwen"}}, "p1"},
		{"none with it", fakeLists{"d0": {"qwen": "", "sql": "qwen"}, "p0": {"qwen": ""}, "p1": {"qwen": ""}}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := listsRouter(t, Config{Workers: workers, LoRAAdapters: declared}, tt.lists, nil)
			// Distinct prompts held in flight: by load alone they would spread over
			// both prefill workers.
			for i := range 4 {
				d, err := r.Route(context.Background(), &Request{Model: "sql", Prompt: strings.Repeat(fmt.Sprint("prompt ", i, " to prefill "), 20)})
				require.NoError(t, err)
				defer d.Release()
				assert.Equal(t, "d0", d.Worker)
				got := ""
				if d.Prefill != nil {
					got = d.Prefill.Worker
				}
				assert.Equal(t, tt.wantPrefill, got)
			}
		})
	}
}

func TestWorkerLoRAAdaptersAreValidated(t *testing.T) {
	declared := []LoRAAdapter{{Name: "sql", BaseModel: "qwen"}, {Name: "poem", BaseModel: "llama"}}
	tests := []struct {
		name    string
		worker  Worker
		wantErr string
	}{
		{"declared adapters of its model", Worker{Name: "a", Address: "127.0.0.1:1", Models: []string{"qwen"}, LoRAAdapters: []string{"sql"}}, ""},
		{"any model", Worker{Name: "a", Address: "127.0.0.1:1", LoRAAdapters: []string{"sql", "poem"}}, ""},
		{"undeclared", Worker{Name: "a", Address: "127.0.0.1:1", LoRAAdapters: []string{"tools"}}, `workers[0].lora_adapters[0]: "tools" is not in lora_adapters`},
		{"twice", Worker{Name: "a", Address: "127.0.0.1:1", LoRAAdapters: []string{"sql", "sql"}}, `workers[0].lora_adapters[1]: "sql" is listed twice`},
		{"of another model", Worker{Name: "a", Address: "127.0.0.1:1", Models: []string{"qwen"}, LoRAAdapters: []string{"poem"}}, `workers[0].lora_adapters[0]: "poem" is an adapter of "llama", which the worker does not serve`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Config{BlockSize: 4, Workers: []Worker{tt.worker}, LoRAAdapters: declared}.Validate()
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

// flipLists answers from before for its first calls, then from later: an engine's list
// read (ReadAll) landing in the middle of a decision.
type flipLists struct {
	calls         atomic.Int32
	after         int32
	before, later fakeLists
}

func (f *flipLists) ServesModel(worker, model string) (bool, bool) {
	if f.calls.Add(1) <= f.after {
		return f.before.ServesModel(worker, model)
	}
	return f.later.ServesModel(worker, model)
}

func (f *flipLists) ServesAdapter(worker, adapter string) (bool, bool) {
	if f.calls.Add(1) <= f.after {
		return f.before.ServesAdapter(worker, adapter)
	}
	return f.later.ServesAdapter(worker, adapter)
}

func (f *flipLists) BaseOf(adapter string) (string, bool) { return f.before.BaseOf(adapter) }

type allOut struct{}

func (allOut) Eligible(string) bool { return false }

// An adapter request is never refused for the lists alone (helper-32's review): the
// fallback to every worker that may load the adapter applies whenever no destination
// the request can reach lists it, however the lists change under the decision, and a
// worker's own lora_adapters is always honoured.
func TestAdapterListsNeverLoseARequest(t *testing.T) {
	declared := []LoRAAdapter{{Name: "sql", BaseModel: "qwen"}}
	q := func(name, port string, own ...string) Worker {
		return Worker{Name: name, Address: "127.0.0.1:" + port, Models: []string{"qwen"}, LoRAAdapters: own}
	}
	tests := []struct {
		name         string
		workers      []Worker
		lists        ModelLists
		subset       []string
		health       Eligibility
		onDemand     bool
		wantWorkers  []string
		wantUnlisted bool
		anyUnlisted  bool // the lists change between requests
		wantAllOut   bool
		wantPrefill  string // every request's prefill worker, when set
		wantErr      error
	}{
		{name: "only a prefill worker lists it",
			workers: []Worker{{Name: "d0", Address: "127.0.0.1:8001", Role: RoleDecode}, {Name: "p0", Address: "127.0.0.1:8002", Role: RolePrefill}},
			lists:   fakeLists{"d0": {}, "p0": {"sql": "qwen"}}, wantWorkers: []string{"d0"}, wantUnlisted: true},
		{name: "the subset leaves out the worker that lists it", workers: []Worker{q("a", "8001"), q("b", "8002")},
			lists: fakeLists{"a": {"sql": "qwen"}, "b": {}}, subset: []string{"127.0.0.1:8002"}, wantWorkers: []string{"b"}, wantUnlisted: true},
		{name: "a list read lands mid-decision", workers: []Worker{q("a", "8001"), q("b", "8002")},
			lists: &flipLists{after: 1, before: fakeLists{}, later: fakeLists{"a": {}, "b": {}}}, wantWorkers: []string{"a", "b"}, anyUnlisted: true},
		{name: "a list read lands mid-decision, evidence first", workers: []Worker{q("a", "8001"), q("b", "8002")},
			lists:       &flipLists{after: 2, before: fakeLists{"a": {"sql": "qwen"}, "b": {}}, later: fakeLists{"a": {}, "b": {}}},
			wantWorkers: []string{"a", "b"}, anyUnlisted: true},
		{name: "every worker out: the one that lists it", workers: []Worker{q("a", "8001"), q("b", "8002")},
			lists: fakeLists{"a": {}, "b": {"sql": "qwen"}}, health: allOut{}, wantWorkers: []string{"b"}, wantAllOut: true},
		{name: "unlisted: a prefill worker whose own list names it still prefills",
			workers: []Worker{{Name: "d0", Address: "127.0.0.1:8001", Role: RoleDecode}, {Name: "p0", Address: "127.0.0.1:8002", Role: RolePrefill, LoRAAdapters: []string{"sql"}}},
			lists:   fakeLists{"d0": {}}, wantWorkers: []string{"d0"}, wantUnlisted: true, wantPrefill: "p0"},
		{name: "unlisted: not to a worker whose own list leaves it out", workers: []Worker{q("a", "8001", "chat"), q("b", "8002")},
			lists: fakeLists{"b": {}}, wantWorkers: []string{"b"}, wantUnlisted: true},
		{name: "no worker's own list names it", workers: []Worker{q("a", "8001", "chat"), q("b", "8002", "chat")},
			wantErr: ErrModelNotFound},
		{name: "only a prefill worker's own list names it",
			workers: []Worker{{Name: "d0", Address: "127.0.0.1:8001", Role: RoleDecode, LoRAAdapters: []string{"chat"}}, {Name: "p0", Address: "127.0.0.1:8002", Role: RolePrefill, LoRAAdapters: []string{"sql"}}},
			wantErr: ErrOnlyPrefillWorkers},
		{name: "on demand: the lists do not narrow", workers: []Worker{q("a", "8001"), q("b", "8002")},
			lists: fakeLists{"a": {"sql": "qwen"}, "b": {}}, onDemand: true, wantWorkers: []string{"a", "b"}},
		{name: "on demand: a worker's own list still does", workers: []Worker{q("a", "8001", "sql"), q("b", "8002", "chat")},
			lists: fakeLists{"a": {}, "b": {}}, onDemand: true, wantWorkers: []string{"a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			adapters := declared
			if tt.workers[0].LoRAAdapters != nil {
				adapters = append(slices.Clone(declared), LoRAAdapter{Name: "chat", BaseModel: "qwen"})
			}
			r := listsRouter(t, Config{Workers: tt.workers, LoRAAdapters: adapters, LoRAOnDemand: tt.onDemand}, tt.lists, tt.health)
			went := map[string]bool{}
			for i := range 4 {
				d, err := r.Route(context.Background(), &Request{Model: "sql", Prompt: strings.Repeat(fmt.Sprint("prompt ", i, " words "), 20), Subset: tt.subset})
				if tt.wantErr != nil {
					require.ErrorIs(t, err, tt.wantErr)
					return
				}
				require.NoError(t, err)
				defer d.Release()
				went[d.Worker] = true
				if !tt.anyUnlisted {
					assert.Equal(t, tt.wantUnlisted, d.LoRAUnlisted)
				}
				assert.Equal(t, tt.wantAllOut, d.AllOut)
				if tt.wantPrefill != "" && assert.NotNil(t, d.Prefill) {
					assert.Equal(t, tt.wantPrefill, d.Prefill.Worker)
				}
			}
			assert.ElementsMatch(t, tt.wantWorkers, slices.Collect(maps.Keys(went)))
		})
	}
}

// The property test's findings (listfilter_property_test.go). A worker configured
// without models whose own lora_adapters name the adapter serves its base model by
// config (lora_adapters are validated against the models a worker serves): while its
// engine's list is unknown that is evidence, and the adapter goes only to the workers
// that name it, not also to those whose lists leave it out. And a request that went to
// workers whose lists leave its adapter out is marked lora_unlisted, even when a worker
// that the base-model lists leave out names the adapter.
func TestAdapterFallbackOnlyWhenNoWorkerOfTheModelNamesIt(t *testing.T) {
	declared := []LoRAAdapter{{Name: "sql", BaseModel: "qwen"}}
	qwen := Worker{Name: "a", Address: "127.0.0.1:8001", Models: []string{"qwen"}}
	openOwn := Worker{Name: "b", Address: "127.0.0.1:8002", LoRAAdapters: []string{"sql"}}
	open := Worker{Name: "b", Address: "127.0.0.1:8002"}
	tests := []struct {
		name         string
		workers      []Worker
		lists        fakeLists
		wantWorkers  []string
		wantUnlisted bool
	}{
		{name: "own lora_adapters name it, its engine's list unknown: only there",
			workers: []Worker{qwen, openOwn}, lists: fakeLists{"a": {"qwen": ""}},
			wantWorkers: []string{"b"}},
		{name: "own lora_adapters name it, its engine lists another base model: unlisted",
			workers: []Worker{qwen, openOwn}, lists: fakeLists{"a": {"qwen": ""}, "b": {"llama": ""}},
			wantWorkers: []string{"a"}, wantUnlisted: true},
		{name: "an engine lists it on another base model: unlisted",
			workers: []Worker{qwen, open}, lists: fakeLists{"a": {"qwen": ""}, "b": {"llama": "", "sql": "llama"}},
			wantWorkers: []string{"a"}, wantUnlisted: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := listsRouter(t, Config{Workers: tt.workers, LoRAAdapters: declared}, tt.lists, nil)
			went := map[string]bool{}
			for i := range 4 {
				d, err := r.Route(context.Background(), &Request{Model: "sql", Prompt: strings.Repeat(fmt.Sprint("prompt ", i, " words "), 20)})
				require.NoError(t, err)
				defer d.Release()
				went[d.Worker] = true
				assert.Equal(t, tt.wantUnlisted, d.LoRAUnlisted, "LoRAUnlisted")
				assert.False(t, d.ModelUnlisted, "ModelUnlisted")
			}
			assert.ElementsMatch(t, tt.wantWorkers, slices.Collect(maps.Keys(went)))
		})
	}
}
