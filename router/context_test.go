package router

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/session"
	"github.com/kvroute/kvroute/tokenize"
)

// fakeContexts is each worker's engine context as its model list gives it (any model);
// a worker absent from it has none known.
type fakeContexts map[string]int

func (f fakeContexts) ContextLength(worker, _ string) (int, bool) {
	n, ok := f[worker]
	return n, ok
}

// encodingOf answers every prompt with one encoding.
type encodingOf tokenize.Encoding

func (e encodingOf) EncodePrompt(context.Context, tokenize.Prompt) (tokenize.Encoding, error) {
	return tokenize.Encoding(e), nil
}

type contextFixture struct {
	router   *Router
	index    *index.Index
	bookings *scoring.Bookings
	sessions *session.Store
	metrics  *Metrics
}

// newContextFixture is a router (block size 4, the default cost) over workers, with
// the engines' contexts given and every prompt text encoded as enc.
func newContextFixture(t *testing.T, workers []Worker, contexts ContextLengths, enc tokenize.PromptEncoder) contextFixture {
	t.Helper()
	idx, err := index.New(index.Config{CapacityBlocks: 1000}, nil)
	require.NoError(t, err)
	for _, w := range workers {
		require.NoError(t, idx.SetWorker(w.Name, 0))
	}
	picker, err := scoring.NewKVCost(scoring.DefaultParams(), rand.New(rand.NewPCG(1, 1)))
	require.NoError(t, err)
	sessions, err := session.New(session.Config{TTL: time.Hour, MaxEntries: 10}, nil)
	require.NoError(t, err)
	metrics := NewMetrics(prometheus.NewRegistry())
	bookings := scoring.NewBookings()
	r, err := New(Config{BlockSize: 4, Workers: workers}, Deps{Tokenizers: OneTokenizer(enc), Index: idx, Bookings: bookings,
		Picker: picker, RecordBlocks: true, ContextLengths: contexts, Sessions: sessions, Metrics: metrics})
	require.NoError(t, err)
	return contextFixture{router: r, index: idx, bookings: bookings, sessions: sessions, metrics: metrics}
}

// TestAPromptGoesWhereItFits: an engine refuses a prompt of its context (max_model_len)
// or more tokens before computing any, so a prompt whose exact ids reach a worker's
// context goes to a worker it fits, even when the other holds its prefix; where it fits
// none, it goes where the cost sends it (the engine answers the 400) with no prefill
// booked and nothing recorded, so it moves no other request and credits no cache.
func TestAPromptGoesWhereItFits(t *testing.T) {
	workers := []Worker{
		{Name: "short", Address: "127.0.0.1:8001", MaxModelLen: 16}, // from the config
		{Name: "long", Address: "127.0.0.1:8002"},                   // from its engine's list
	}
	tests := []struct {
		name          string
		longContext   int // "long"'s list; 0: unknown
		tokens        int
		want          string
		wantNarrowed  bool
		wantExceeded  bool
		wantPrefill   int
		wantMetricFor string
	}{
		{"within both: the holder", 64, 15, "short", false, false, 15 - 12, ""},
		{"the short one's context exactly: refused there", 64, 16, "long", true, false, 16, "some"},
		{"past the short one's, the long one's unknown", 0, 40, "long", true, false, 40, "some"},
		{"past both: booked and recorded nowhere, routed by load", 32, 40, "", false, true, 0, "all"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			contexts := fakeContexts{}
			if tt.longContext > 0 {
				contexts["long"] = tt.longContext
			}
			f := newContextFixture(t, workers, contexts, encodingOf{})
			// "short" holds the prompt's first 3 blocks: the cost prefers it.
			require.NoError(t, f.index.Store("short", f.router.prompter.blocks(&Request{Model: "m"}, tokens(0, 12))))
			entries := map[string]int{"short": f.index.WorkerEntries("short"), "long": f.index.WorkerEntries("long")}

			d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, tt.tokens), Session: "s"})
			require.NoError(t, err)
			defer d.Release()
			if tt.want != "" {
				assert.Equal(t, tt.want, d.Worker)
			}
			assert.Equal(t, tt.wantNarrowed, d.ContextNarrowed)
			assert.Equal(t, tt.wantExceeded, d.ContextExceeded)
			assert.Equal(t, tt.wantPrefill, f.bookings.Load(d.Worker).PrefillTokens, "booked prefill")
			assert.Equal(t, 1, f.bookings.Load(d.Worker).ActiveRequests, "the request is still booked: it is in flight")
			wantActive := tt.tokens / 4
			if tt.wantExceeded {
				wantActive = 0 // the engine allocates no block for a prompt it refuses
			}
			assert.Equal(t, wantActive, f.bookings.Load(d.Worker).ActiveBlocks, "active blocks")
			_, remembered := f.sessions.Lookup("s")
			assert.Equal(t, !tt.wantExceeded, remembered, "the session remembered")
			if tt.wantExceeded {
				assert.Equal(t, entries["short"], f.index.WorkerEntries("short"), "nothing recorded")
				assert.Equal(t, entries["long"], f.index.WorkerEntries("long"), "nothing recorded")
				// The engine's 400 forgets nothing: not the blocks another request (or
				// the engine's events) put there meanwhile, which this prompt shares.
				all := f.router.prompter.blocks(&Request{Model: "m"}, tokens(0, tt.tokens))
				require.NoError(t, f.index.Store(d.Worker, all))
				require.NoError(t, d.Refused())
				assert.Equal(t, len(all), f.index.WorkerEntries(d.Worker), "the blocks others put there kept after the refusal")
			} else {
				assert.Equal(t, tt.tokens/4, f.index.WorkerEntries(d.Worker), "the prompt's blocks recorded")
			}
			for _, label := range []string{"some", "all"} {
				want := 0.0
				if label == tt.wantMetricFor {
					want = 1
				}
				assert.Equal(t, want, testutil.ToFloat64(f.metrics.pastContext.WithLabelValues(label)), label)
			}
		})
	}
}

// TestApproximateIDsAreNoEnginesLength: ids of the file-free Approx tokenizer are an
// estimate of the engine's count, so they leave no worker out and mark no prompt
// refused; the prefill they book is still capped at the chosen engine's context, which
// computes no more than that of any prompt. So is a cut encoding's estimated rest.
func TestApproximateIDsAreNoEnginesLength(t *testing.T) {
	workers := []Worker{{Name: "a", Address: "127.0.0.1:8001", MaxModelLen: 20}}
	tests := []struct {
		name        string
		enc         tokenize.Encoding
		wantPrefill int
		exceeded    bool
	}{
		{"approximate ids past the context", tokenize.Encoding{IDs: tokens(0, 40), Approximate: true}, 20, false},
		{"approximate ids within it", tokenize.Encoding{IDs: tokens(0, 12), Approximate: true}, 12, false},
		{"exact ids within it, the rest estimated past it", tokenize.Encoding{IDs: tokens(0, 12), Rest: 400}, 20, false},
		{"exact ids past it", tokenize.Encoding{IDs: tokens(0, 20), Rest: 400}, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newContextFixture(t, workers, nil, encodingOf(tt.enc))
			d, err := f.router.Route(context.Background(), &Request{Model: "m", Prompt: "text"})
			require.NoError(t, err)
			defer d.Release()
			assert.Equal(t, tt.exceeded, d.ContextExceeded)
			assert.False(t, d.ContextNarrowed)
			assert.Equal(t, tt.wantPrefill, f.bookings.Load("a").PrefillTokens)
		})
	}
}

// TestAPrefillWorkerPastItsContextIsLeftOut: in a disaggregated fleet a prefill worker
// whose engine would refuse the prompt is not asked to compute it; with none left the
// destination computes it.
func TestAPrefillWorkerPastItsContextIsLeftOut(t *testing.T) {
	workers := []Worker{
		{Name: "decode", Address: "127.0.0.1:8001"},
		{Name: "p-short", Address: "127.0.0.1:8002", Role: RolePrefill, MaxModelLen: 16},
		{Name: "p-long", Address: "127.0.0.1:8003", Role: RolePrefill, MaxModelLen: 64},
	}
	tests := []struct {
		name        string
		tokens      int
		wantPrefill []string
	}{
		{"both fit", 12, []string{"p-short", "p-long"}},
		{"only the long one fits", 40, []string{"p-long"}},
		{"neither fits: the destination prefills", 80, []string{""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newContextFixture(t, workers, nil, encodingOf{})
			d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, tt.tokens)})
			require.NoError(t, err)
			defer d.Release()
			got := ""
			if d.Prefill != nil {
				got = d.Prefill.Worker
			}
			assert.Contains(t, tt.wantPrefill, got)
			assert.Equal(t, "decode", d.Worker)
		})
	}
}

func TestMaxModelLenIsValidated(t *testing.T) {
	for _, n := range []int{-1, MaxContextLength + 1} {
		err := Config{BlockSize: 4, Workers: []Worker{{Name: "a", Address: "127.0.0.1:8001", MaxModelLen: n}}}.Validate()
		require.ErrorContains(t, err, "workers[0].max_model_len: must be in [0, 2147483647]")
	}
	require.NoError(t, Config{BlockSize: 4, Workers: []Worker{{Name: "a", Address: "127.0.0.1:8001", MaxModelLen: MaxContextLength}}}.Validate())
}

// TestAWorkerRemovedMidDecisionLeavesNoLoadBehindForAPromptPastItsContext: a prompt
// past every context records nothing, but its worker, removed between the candidate
// list and the booking, must still be marked departed in the ledger (as a recording
// decision marks it), or its name stays there for good.
func TestAWorkerRemovedMidDecisionLeavesNoLoadBehindForAPromptPastItsContext(t *testing.T) {
	workers := []Worker{{Name: "a", Address: "127.0.0.1:8001", MaxModelLen: 16}}
	f := newContextFixture(t, workers, nil, encodingOf{})
	f.router.deps.Signals = &fleetChange{once: func() {
		// What fleet.Apply does, in its order.
		require.NoError(t, f.router.SetWorkers(nil))
		f.index.RemoveWorker("a")
		f.bookings.RemoveWorker("a")
	}}
	d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40)})
	require.NoError(t, err)
	require.True(t, d.ContextExceeded)
	d.Release()
	loads, _ := f.bookings.LoadsWithAdapters()
	assert.NotContains(t, loads, "a", "the departed worker is forgotten")
}

// sinkRecords keeps what a RecordSink hears (the peers' records).
type sinkRecords []string

func (s *sinkRecords) Recorded(worker, _ string, blocks []uint64, session string) {
	*s = append(*s, fmt.Sprintf("%s: %d blocks, session %q", worker, len(blocks), session))
}

// TestAFallbackServingAPromptPastEveryContextBooksNothing: a prompt past every
// candidate's context is refused by whichever engine gets it, a fallback too (the data
// plane sends it there when the chosen one cannot be reached), so moving it books no
// prefill on the fallback, moves no session there and tells the peers nothing, as the
// decision did not on the chosen worker. A prompt that fits moves as before, its
// booked prefill capped at the fallback's context as a decision's is.
func TestAFallbackServingAPromptPastEveryContextBooksNothing(t *testing.T) {
	workers := []Worker{
		{Name: "a", Address: "127.0.0.1:8001", MaxModelLen: 16},
		{Name: "b", Address: "127.0.0.1:8002", MaxModelLen: 16},
	}
	tests := []struct {
		name         string
		enc          tokenize.Encoding
		wantExceeded bool
		wantPrefill  int
		wantSession  bool
		wantRecords  int
	}{
		{"past every context", tokenize.Encoding{IDs: tokens(0, 400)}, true, 0, false, 0},
		{"within them", tokenize.Encoding{IDs: tokens(0, 12)}, false, 12, true, 2},
		{"approximate ids past them: capped at the fallback's context", tokenize.Encoding{IDs: tokens(0, 400), Approximate: true}, false, 16, true, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newContextFixture(t, workers, nil, encodingOf(tt.enc))
			var records sinkRecords
			f.router.deps.Records = &records
			d, err := f.router.Route(context.Background(), &Request{Model: "m", Prompt: "text", Session: "s"})
			require.NoError(t, err)
			defer d.Release()
			require.Equal(t, tt.wantExceeded, d.ContextExceeded)

			fallback, moved, err := d.Served(d.FallbackAddresses[0])
			require.NoError(t, err)
			require.True(t, moved, "the request is in flight on the fallback")
			assert.Equal(t, 1, f.bookings.Load(fallback).ActiveRequests)
			assert.Equal(t, tt.wantPrefill, f.bookings.Load(fallback).PrefillTokens, "prefill booked on the fallback")
			last, remembered := f.sessions.Lookup("s")
			assert.Equal(t, tt.wantSession, remembered, "the session remembered")
			if tt.wantSession {
				assert.Equal(t, fallback, last)
			}
			assert.Len(t, records, tt.wantRecords, "records the peers hear: %v", records)
		})
	}
}

// TestAPromptGoesWhereItFitsWithItsMaxTokens: vLLM refuses a request whose prompt
// tokens plus its max_tokens (max_completion_tokens) pass the context, so such a
// request goes where both fit; where only its prompt fits (an engine that trims the
// output serves it there), it goes where the prompt fits, booked and recorded as any.
func TestAPromptGoesWhereItFitsWithItsMaxTokens(t *testing.T) {
	workers := []Worker{
		{Name: "short", Address: "127.0.0.1:8001", MaxModelLen: 64},
		{Name: "long", Address: "127.0.0.1:8002", MaxModelLen: 256},
	}
	tests := []struct {
		name         string
		tokens       int
		maxTokens    int64
		want         string
		wantNarrowed bool
	}{
		{"no bound: the holder", 40, 0, "short", false},
		{"both fit the short context exactly: the holder", 40, 24, "short", false},
		{"one token past the short context: the long one", 40, 25, "long", true},
		{"a bound past every context: where the prompt fits, the holder", 40, 1000, "short", false},
		{"the largest bound", 40, math.MaxInt64, "short", false},
		{"the prompt past the short context, a bound past the long one", 70, 1000, "long", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newContextFixture(t, workers, nil, encodingOf{})
			require.NoError(t, f.index.Store("short", f.router.prompter.blocks(&Request{Model: "m"}, tokens(0, 36))))
			d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, tt.tokens), MaxTokens: tt.maxTokens, Session: "s"})
			require.NoError(t, err)
			defer d.Release()
			assert.Equal(t, tt.want, d.Worker)
			assert.Equal(t, tt.wantNarrowed, d.ContextNarrowed)
			assert.False(t, d.ContextExceeded, "the prompt fits somewhere: not taken as refused")
			assert.Equal(t, tt.tokens/4, f.index.WorkerEntries(d.Worker), "the prompt's blocks recorded")
			_, remembered := f.sessions.Lookup("s")
			assert.True(t, remembered)
		})
	}
}

// TestAPromptOnlyAnOutWorkerFitsGoesThere: every eligible candidate's engine refuses a
// prompt past its context for sure (a 400 telling the client to shorten a prompt the
// fleet can serve), while a worker out for a health back-off may well serve it: the
// request goes among the out workers it fits, as it does when every candidate is out
// (AllOut). With none fitting it is past every context, as before.
func TestAPromptOnlyAnOutWorkerFitsGoesThere(t *testing.T) {
	workers := []Worker{
		{Name: "short", Address: "127.0.0.1:8001", MaxModelLen: 16},
		{Name: "long", Address: "127.0.0.1:8002", MaxModelLen: 64},
		{Name: "longer", Address: "127.0.0.1:8003", MaxModelLen: 128},
	}
	tests := []struct {
		name         string
		out          outSet
		tokens       int
		want         []string
		wantAllOut   bool
		wantExceeded bool
	}{
		{"the long ones eligible", outSet{}, 40, []string{"long", "longer"}, false, false},
		{"the long ones out: among them", outSet{"long": true, "longer": true}, 40, []string{"long", "longer"}, true, false},
		{"one long one out, the other fits: the eligible one", outSet{"long": true}, 40, []string{"longer"}, false, false},
		{"the one it fits out: that one", outSet{"long": true, "longer": true}, 100, []string{"longer"}, true, false},
		{"out, and past its context too: past every context", outSet{"longer": true}, 200, []string{"short", "long"}, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newContextFixture(t, workers, nil, encodingOf{})
			f.router.deps.Health = tt.out
			d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, tt.tokens)})
			require.NoError(t, err)
			defer d.Release()
			assert.Contains(t, tt.want, d.Worker)
			if !tt.wantExceeded {
				assert.NotContains(t, d.FallbackAddresses, "127.0.0.1:8001", "no fallback to an engine that refuses the prompt")
			}
			assert.Equal(t, tt.wantAllOut, d.AllOut)
			assert.Equal(t, tt.wantExceeded, d.ContextExceeded)
			assert.Equal(t, !tt.wantExceeded, d.ContextNarrowed)
		})
	}
}

// TestAPromptPastEveryContextLoadsNoAdapter: the engine refuses such a prompt before
// scheduling it, so its LoRA adapter is not loaded there: the booking counts the
// request but no adapter running (or resident after) on the worker, which the cost's
// lora_weight and the peers would read as a slot taken.
func TestAPromptPastEveryContextLoadsNoAdapter(t *testing.T) {
	workers := []Worker{{Name: "a", Address: "127.0.0.1:8001", MaxModelLen: 16}}
	for _, tt := range []struct {
		name         string
		tokens       int
		wantAdapters map[string]map[string]int
	}{
		{"within the context", 12, map[string]map[string]int{"a": {"sql": 1}}},
		{"past it", 40, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newContextFixture(t, workers, nil, encodingOf{})
			d, err := f.router.Route(context.Background(), &Request{Model: "m", LoRA: "sql", Tokens: tokens(0, tt.tokens)})
			require.NoError(t, err)
			defer d.Release()
			loads, adapters := f.bookings.LoadsWithAdapters()
			assert.Equal(t, 1, loads["a"].ActiveRequests, "the request is in flight")
			assert.Equal(t, tt.wantAdapters, adapters)
		})
	}
}

// TestAPromptTheEngineCutsToItsContextIsNoRefusal: with truncate_prompt_tokens -1 vLLM
// cuts the prompt to its context and serves it, so a prompt past every context is not
// taken as refused (its prefill is booked, capped at the context) and no worker is left
// out for its length.
func TestAPromptTheEngineCutsToItsContextIsNoRefusal(t *testing.T) {
	workers := []Worker{{Name: "short", Address: "127.0.0.1:8001", MaxModelLen: 16}, {Name: "long", Address: "127.0.0.1:8002", MaxModelLen: 32}}
	minusOne := int64(-1)
	f := newContextFixture(t, workers, nil, encodingOf{})
	d, err := f.router.Route(context.Background(), &Request{Model: "m", Tokens: tokens(0, 40), TruncatePromptTokens: &minusOne})
	require.NoError(t, err)
	defer d.Release()
	assert.False(t, d.ContextExceeded)
	assert.False(t, d.ContextNarrowed)
	want := map[string]int{"short": 16, "long": 32}[d.Worker]
	assert.Equal(t, want, f.bookings.Load(d.Worker).PrefillTokens, "the engine computes its context's worth")
}
