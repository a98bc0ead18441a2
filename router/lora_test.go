package router

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
)

// recordingTokenizers notes the model each prompt was encoded for.
type recordingTokenizers struct{ asked []string }

func (r *recordingTokenizers) Model(name string) tokenize.PromptEncoder {
	r.asked = append(r.asked, name)
	return tokenize.Pipeline{Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}}
}

// adapterRouter is a router over workers with the given adapters, the default policy,
// and an index recording its decisions.
func adapterRouter(t *testing.T, workers []Worker, adapters []LoRAAdapter, tokenizers Tokenizers) (*Router, *index.Index) {
	t.Helper()
	idx, err := index.New(index.Config{CapacityBlocks: 1000}, nil)
	require.NoError(t, err)
	for _, w := range workers {
		require.NoError(t, idx.SetWorker(w.Name, 0))
	}
	picker, err := scoring.NewKVCost(scoring.DefaultParams(), rand.New(rand.NewPCG(1, 1)))
	require.NoError(t, err)
	if tokenizers == nil {
		tokenizers = OneTokenizer(tokenize.Pipeline{Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}})
	}
	r, err := New(Config{BlockSize: 4, Workers: workers, LoRAAdapters: adapters},
		Deps{Tokenizers: tokenizers, Index: idx, Bookings: scoring.NewBookings(), Picker: picker, RecordBlocks: true})
	require.NoError(t, err)
	return r, idx
}

// A request naming a LoRA adapter runs on its base model's workers, is encoded by the
// base model's tokenizer, and hashes its blocks in the adapter's namespace, the one the
// engine's KV events give its blocks (Salt(base, adapter, cache salt)).
func TestAnAdapterRequestRunsOnItsBaseModel(t *testing.T) {
	workers := []Worker{
		{Name: "llama-0", Address: "127.0.0.1:8001", Models: []string{"llama"}},
		{Name: "qwen-0", Address: "127.0.0.1:8002", Models: []string{"qwen"}},
	}
	adapters := []LoRAAdapter{{Name: "sql", BaseModel: "qwen"}, {Name: "gone", BaseModel: "mistral"}}
	prompt := strings.Repeat("select the rows that matter ", 8)
	tests := []struct {
		name        string
		req         Request
		wantWorker  string
		wantModel   string
		wantLoRA    string
		wantSalt    uint64
		wantErr     error
		wantEncoder string
	}{
		{name: "base model", req: Request{Model: "qwen", Prompt: prompt},
			wantWorker: "qwen-0", wantModel: "qwen", wantSalt: index.Salt("qwen", "", ""), wantEncoder: "qwen"},
		{name: "adapter", req: Request{Model: "sql", Prompt: prompt},
			wantWorker: "qwen-0", wantModel: "qwen", wantLoRA: "sql", wantSalt: index.Salt("qwen", "sql", ""), wantEncoder: "qwen"},
		{name: "adapter with a cache salt", req: Request{Model: "sql", CacheSalt: "tenant-a", Prompt: prompt},
			wantWorker: "qwen-0", wantModel: "qwen", wantLoRA: "sql", wantSalt: index.Salt("qwen", "sql", "tenant-a"), wantEncoder: "qwen"},
		{name: "adapter named by the caller", req: Request{Model: "qwen", LoRA: "sql", Prompt: prompt},
			wantWorker: "qwen-0", wantModel: "qwen", wantLoRA: "sql", wantSalt: index.Salt("qwen", "sql", ""), wantEncoder: "qwen"},
		{name: "adapter of a model no worker serves", req: Request{Model: "gone", Prompt: prompt}, wantErr: ErrModelNotFound},
		{name: "load-only routing by an adapter's name", req: Request{Model: "sql", Tokens: []uint32{}},
			wantWorker: "qwen-0", wantModel: "qwen", wantLoRA: "sql"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tokenizers := &recordingTokenizers{}
			r, idx := adapterRouter(t, workers, adapters, tokenizers)

			req := tt.req
			d, err := r.Route(context.Background(), &req)
			assert.Equal(t, tt.req, req, "the caller's request is left as it was")
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				assert.Contains(t, err.Error(), `"mistral" (the base model of LoRA adapter "gone")`, "the error names the adapter and its base")
				return
			}
			require.NoError(t, err)
			defer d.Release()
			assert.Equal(t, tt.wantWorker, d.Worker)
			assert.Equal(t, tt.wantModel, d.Model)
			assert.Equal(t, tt.wantLoRA, d.LoRA)
			if tt.wantEncoder == "" {
				return
			}
			assert.Equal(t, []string{tt.wantEncoder}, tokenizers.asked)
			enc, err := tokenize.Pipeline{Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}}.EncodePrompt(context.Background(), tokenize.Prompt{Text: prompt})
			require.NoError(t, err)
			want := index.BlockHashes(nil, enc.IDs, 4, tt.wantSalt)
			require.NotEmpty(t, want)
			ov := make([]int, 1)
			idx.Overlaps(want, []string{d.Worker}, ov)
			assert.Equal(t, len(want), ov[0], "the worker holds the blocks in the namespace an engine gives them")
		})
	}
}

// An adapter's cache is its own: a prefix routed under the base model does not pull the
// same prompt for an adapter (or for another adapter) to its holder.
func TestAnAdapterDoesNotShareItsBaseModelsCache(t *testing.T) {
	workers := []Worker{{Name: "a", Address: "127.0.0.1:8001", Models: []string{"qwen"}}, {Name: "b", Address: "127.0.0.1:8002", Models: []string{"qwen"}}}
	r, _ := adapterRouter(t, workers, []LoRAAdapter{{Name: "sql", BaseModel: "qwen"}, {Name: "chat", BaseModel: "qwen"}}, nil)
	prompt := strings.Repeat("the same long instructions for every model ", 10)
	for i, step := range []struct {
		model      string
		wantCached bool
	}{{"qwen", false}, {"sql", false}, {"chat", false}, {"sql", true}} {
		d, err := r.Route(context.Background(), &Request{Model: step.model, Prompt: prompt})
		require.NoError(t, err)
		assert.Equal(t, step.wantCached, d.PredictedCachedTokens > 0, "request %d (%s) finds blocks: %d tokens", i, step.model, d.PredictedCachedTokens)
		d.FirstToken()
		d.Release()
	}
}

// With the workers' max_loras known, adapter requests go where their adapter runs or a
// slot is free: with one slot per worker, two adapters in flight split over two
// workers and each adapter's next request joins its own.
func TestAdapterRequestsGoWhereTheirAdapterRuns(t *testing.T) {
	workers := []Worker{{Name: "a", Address: "127.0.0.1:8001", MaxLoRAs: 1}, {Name: "b", Address: "127.0.0.1:8002", MaxLoRAs: 1}}
	r, _ := adapterRouter(t, workers, []LoRAAdapter{{Name: "sql", BaseModel: "qwen"}, {Name: "chat", BaseModel: "qwen"}}, nil)
	route := func(model, prompt string) *Decision {
		d, err := r.Route(context.Background(), &Request{Model: model, Prompt: prompt})
		require.NoError(t, err)
		t.Cleanup(func() { d.Release() })
		return d
	}
	sql := route("sql", "list the tables")
	chat := route("chat", "say hello")
	assert.NotEqual(t, sql.Worker, chat.Worker, "the second adapter takes the free slot")
	for i := range 3 {
		// Fresh prompts, so no cache pulls them: the adapter alone decides.
		next := route("sql", strings.Repeat("count the rows ", i+2))
		assert.Equal(t, sql.Worker, next.Worker, "sql request %d joins its adapter, on the busier worker", i)
		assert.Zero(t, next.Terms[next.Chosen].LoRABlocked)
	}
	other := route("chat", "say goodbye")
	assert.Equal(t, chat.Worker, other.Worker, "and chat joins its own")
	var onSQL scoring.Terms
	for _, c := range other.Terms {
		if c.Worker == sql.Worker {
			onSQL = c
		}
	}
	assert.Equal(t, 5.0, onSQL.LoRABlocked, "chat would take sql's one slot there, once sql's four requests finish")
}

// Workers set after start (a discovery file, pod annotations, a reload) are held to
// the config's rule: a worker's models name base models, never an adapter, whose
// requests would then find no worker. The set is refused whole and the fleet in force
// keeps serving the adapter.
func TestWorkersSetLaterMayNotListAnAdapter(t *testing.T) {
	adapters := []LoRAAdapter{{Name: "sql", BaseModel: "qwen"}}
	bad := []Worker{{Name: "a", Address: "127.0.0.1:8001", Models: []string{"sql"}}}
	r, _ := adapterRouter(t, []Worker{{Name: "a", Address: "127.0.0.1:8001", Models: []string{"qwen"}}}, adapters, nil)
	assert.ErrorContains(t, r.SetWorkers(bad), `workers[0].models[0]: "sql" is a LoRA adapter`)
	d, err := r.Route(context.Background(), &Request{Model: "sql", Prompt: "hello there"})
	require.NoError(t, err)
	d.Release()
}
