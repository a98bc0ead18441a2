package router

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/health"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
)

// BenchmarkDecision4096Tokens64Workers measures a whole decision without tokenization:
// hash 64 blocks, look up 64 workers in an index of 64 × 4,096 entries, fill bookings
// (each worker carries 8 active requests), ask the health tracker (every worker healthy,
// as in production most of the time), score, pick, book, record, release.
func BenchmarkDecision4096Tokens64Workers(b *testing.B) {
	r, prompts := benchRouter(b)
	routeEach(b, r, prompts)
}

// BenchmarkDecision4096Tokens64WorkersModelLists is the same decision with the
// engines' model lists on (engine_models, the server's default): each of the 64
// workers, configured without models, has a known list naming the model, asked once
// per decision (router.listFilter).
func BenchmarkDecision4096Tokens64WorkersModelLists(b *testing.B) {
	lists := fakeLists{}
	for w := range 64 {
		lists[fmt.Sprintf("worker-%02d", w)] = map[string]string{"m": "", "m-other": ""}
	}
	r, prompts := benchRouterDeps(b, func(d *Deps) { d.ModelLists = lists })
	routeEach(b, r, prompts)
}

// routeEach routes the prompts in turn, one decision (routed and released) per
// iteration.
func routeEach(b *testing.B, r *Router, prompts [][]uint32) {
	b.Helper()
	ctx := context.Background()
	i := 0
	for b.Loop() {
		d, err := r.Route(ctx, &Request{Model: "m", Tokens: prompts[i%len(prompts)]})
		if err != nil {
			b.Fatal(err)
		}
		d.Release()
		i++
	}
}

// BenchmarkDecisionParallel is the same decision from concurrent goroutines (GOMAXPROCS
// of them, as the server's streams are): what the decision lock costs in throughput.
func BenchmarkDecisionParallel(b *testing.B) {
	r, prompts := benchRouter(b)
	ctx := context.Background()
	b.ResetTimer() // the index and bookings setup is not a decision
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			d, err := r.Route(ctx, &Request{Model: "m", Tokens: prompts[i%len(prompts)]})
			if err != nil {
				b.Fatal(err)
			}
			d.Release()
			i++
		}
	})
}

func benchRouter(b *testing.B) (*Router, [][]uint32) {
	b.Helper()
	return benchRouterDeps(b, nil)
}

// benchRouterDeps is benchRouter with its Deps edited (nil: none) before New.
func benchRouterDeps(b *testing.B, edit func(*Deps)) (*Router, [][]uint32) {
	b.Helper()
	idx, err := index.New(index.Config{CapacityBlocks: 4096}, nil)
	if err != nil {
		b.Fatal(err)
	}
	bookings := scoring.NewBookings()
	picker, err := scoring.NewKVCost(scoring.DynamoParams(), nil)
	if err != nil {
		b.Fatal(err)
	}
	var workers []Worker
	for w := range 64 {
		name := fmt.Sprintf("worker-%02d", w)
		workers = append(workers, Worker{Name: name, Address: fmt.Sprintf("10.0.%d.%d:8000", w/200, w%200+1)})
		_ = idx.SetWorker(name, 0)
		for p := range 64 {
			hashes := index.BlockHashes(nil, tokens(1_000_000*(w*64+p+1), 4096), 64, 1)
			_ = idx.Store(name, hashes)
			if p < 8 {
				bookings.Book(name, hashes, 4096)
			}
		}
	}
	tracked := make([]health.Worker, len(workers))
	for i, w := range workers {
		tracked[i] = health.Worker{Name: w.Name, Address: w.Address}
	}
	tracker, err := health.New(health.DefaultConfig(), tracked, health.Deps{})
	if err != nil {
		b.Fatal(err)
	}
	deps := Deps{
		Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{},
		Index: idx, Bookings: bookings, Picker: picker, RecordBlocks: true, Health: tracker,
	}
	if edit != nil {
		edit(&deps)
	}
	r, err := New(Config{BlockSize: 64, Workers: workers}, deps)
	if err != nil {
		b.Fatal(err)
	}
	prompts := make([][]uint32, 16)
	for i := range prompts {
		prompts[i] = tokens(i*10_000, 4096)
	}
	return r, prompts
}

// BenchmarkWaitForHolder4096Tokens64Workers compares, on the same fleet and prompt
// (4,096 tokens, 64 workers, each full at max_active_requests_per_worker 8, the prompt
// held by one of them), a decision that refuses the request for its busy holder with
// what flow control asks of it while it waits for that worker (StillWaits): the
// refused decision hashes the prompt, looks it up and fills the bookings under the
// decision lock; StillWaits takes the request's candidates now (no prompt), looks up
// the refused decision's blocks on them and fills the bookings.
func BenchmarkWaitForHolder4096Tokens64Workers(b *testing.B) {
	r, _ := benchRouter(b)
	r.maxActive = 8
	req := &Request{Model: "m", Tokens: tokens(1_000_000, 4096), WaitForHolder: true}
	if _, err := r.StoreRecord("worker-00", "", index.BlockHashes(nil, req.Tokens, 64, index.Salt("m", "", ""))); err != nil {
		b.Fatal(err)
	}
	_, err := r.Route(context.Background(), req)
	var busy *HolderBusyError
	if !errors.As(err, &busy) {
		b.Fatalf("want a busy holder, got %v", err)
	}
	b.Run("refused decision", func(b *testing.B) {
		for b.Loop() {
			if _, err := r.Route(context.Background(), req); !errors.As(err, &busy) {
				b.Fatal(err)
			}
		}
	})
	b.Run("StillWaits", func(b *testing.B) {
		for b.Loop() {
			if !r.StillWaits(busy) {
				b.Fatal("it no longer waits")
			}
		}
	})
}
