package router_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize/models"
)

// benchBlockSize is vLLM's default block size: four times the blocks of kvroute's
// default (64) to hash and look up.
const benchBlockSize = 16

// chatTurn is one exchange of the benchmark conversation (prose, a list, Go code,
// numbers, an emoji), varied by n: about 330 Qwen3 tokens.
func chatTurn(n int) (user, assistant string) {
	user = fmt.Sprintf("Question %d: our router sends chat requests to %d GPU workers. "+
		"Each worker keeps a prefix cache of %d blocks; explain how to pick the worker that "+
		"already holds the longest prefix, and what happens under load.", n, 8+n, 1024*n)
	assistant = fmt.Sprintf("Turn %d. Routing by cache affinity works like this:\n\n", n) +
		"1. Hash the prompt's token blocks (64 tokens each) with a chained hash, so a block's " +
		"hash names its whole prefix.\n2. Ask the index which workers hold each block; the overlap is the " +
		"number of leading blocks a worker holds.\n3. Score each worker: load plus the prefill the missing " +
		"blocks would cost, and pick the lowest.\n\n" +
		fmt.Sprintf("```go\nfunc pick(ws []Worker, blocks []uint64) int {\n\tbest, bestCost := -1, math.Inf(1)\n"+
			"\tfor i, w := range ws {\n\t\tcost := w.Load() + %d*float64(len(blocks)-w.Overlap(blocks))\n"+
			"\t\tif cost < bestCost {\n\t\t\tbest, bestCost = i, cost\n\t\t}\n\t}\n\treturn best\n}\n```\n\n", n) +
		fmt.Sprintf("Under load (say %d.%d requests per second), the prefill term dominates only while queues "+
			"are short; once a worker's queue exceeds %d requests, spreading beats affinity. Résumé: "+
			"measure, don't guess — p99 matters more than the mean. 🚀", 40+n, n%10, 4+n%3)
	return user, assistant
}

// systemPrompt is a long system prompt (about 700 tokens), as deployed assistants have.
var systemPrompt = "You are a careful assistant for platform engineers running LLM inference. " +
	strings.Repeat("Answer with the commands to run, the config keys to change and the metrics to watch; "+
		"say when a change needs a restart, and never guess a flag's name: cite the engine's documentation. ", 20)

// chatMessage is a message of the benchmark's request bodies.
type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatMessages are the system prompt, then for each of answers an exchange (question
// i+1, the answer of chatTurn(answers[i])).
func chatMessages(answers []int) []chatMessage {
	msgs := []chatMessage{{"system", systemPrompt}}
	for i, a := range answers {
		u, _ := chatTurn(i + 1)
		_, answer := chatTurn(a)
		msgs = append(msgs, chatMessage{"user", u}, chatMessage{"assistant", answer})
	}
	return msgs
}

// chatBody is a request body: chatMessages(answers), then the question of
// chatTurn(question).
func chatBody(tb testing.TB, answers []int, question int) []byte {
	tb.Helper()
	u, _ := chatTurn(question)
	msgs := append(chatMessages(answers), chatMessage{"user", u})
	body, err := json.Marshal(map[string]any{"model": "Qwen/Qwen3-8B", "messages": msgs, "max_tokens": 256, "stream": true})
	if err != nil {
		tb.Fatal(err)
	}
	return body
}

// nextTurns makes the bodies of successive turn-12 requests that differ in their last
// answer and question, as chatBody would, at the cost of the bytes a request brings: the
// shared part is marshalled once, so the benchmark's own garbage (which would make the
// collector run more often during the decisions it times) is one body per decision.
type nextTurns struct {
	head []byte // up to turn 11's answer: '{"max_tokens":256,"messages":[…,'
	tail []byte // after the question: '],"model":…}'
}

func newNextTurns(tb testing.TB) nextTurns {
	tb.Helper()
	question11, _ := chatTurn(11)
	msgs, err := json.Marshal(append(chatMessages(upTo(10)), chatMessage{"user", question11}))
	if err != nil {
		tb.Fatal(err)
	}
	head := append([]byte(`{"max_tokens":256,"messages":`), msgs[:len(msgs)-1]...)
	turns := nextTurns{head: append(head, ','), tail: []byte(`],"model":"Qwen/Qwen3-8B","stream":true}`)}
	if got, want := turns.body(tb, 1000, 100_000), chatBody(tb, append(upTo(10), 1000), 100_000); !bytes.Equal(got, want) {
		tb.Fatalf("nextTurns builds\n%s\nchatBody builds\n%s", got, want)
	}
	return turns
}

// body is chatBody(append(upTo(10), answer), question).
func (t nextTurns) body(tb testing.TB, answer, question int) []byte {
	_, a := chatTurn(answer)
	q, _ := chatTurn(question)
	last, err := json.Marshal([]chatMessage{{"assistant", a}, {"user", q}})
	if err != nil {
		tb.Fatal(err)
	}
	body := make([]byte, 0, len(t.head)+len(last)+len(t.tail))
	body = append(append(append(body, t.head...), last[1:len(last)-1]...), t.tail...)
	return body
}

// upTo returns 1..n.
func upTo(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

// decisionBench is a router over 64 workers as extproc wires it (the embedded Qwen3
// tokenizer and template, a kv picker, bookings, an index recording decisions), the
// index holding 64 other 4,096-token prompts per worker and 8 of them booked per worker.
func decisionBench(b *testing.B) *router.Router {
	b.Helper()
	tokenizers, err := models.Load(nil, models.Deps{})
	if err != nil {
		b.Fatal(err)
	}
	idx, err := index.New(index.Config{CapacityBlocks: 16384}, nil)
	if err != nil {
		b.Fatal(err)
	}
	bookings := scoring.NewBookings()
	picker, err := scoring.NewKVCost(scoring.DynamoParams(), nil)
	if err != nil {
		b.Fatal(err)
	}
	var workers []router.Worker
	ids := make([]uint32, 4096)
	for w := range 64 {
		name := fmt.Sprintf("worker-%02d", w)
		workers = append(workers, router.Worker{Name: name, Address: fmt.Sprintf("10.0.%d.%d:8000", w/200, w%200+1)})
		_ = idx.SetWorker(name, 0)
		for p := range 64 {
			for i := range ids {
				ids[i] = uint32(1_000_000*(w*64+p+1) + i)
			}
			hashes := index.BlockHashes(nil, ids, benchBlockSize, index.Salt("Qwen/Qwen3-8B", "", ""))
			_ = idx.Store(name, hashes)
			if p < 8 {
				bookings.Book(name, hashes, 4096)
			}
		}
	}
	r, err := router.New(router.Config{BlockSize: benchBlockSize, Workers: workers}, router.Deps{
		Tokenizers: tokenizers, Index: idx, Bookings: bookings, Picker: picker, RecordBlocks: true})
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// decide makes the decision for a request body as the filter does: parse, then route
// (render, tokenize, hash, look up, score, pick, book, record). The booking is released
// after the clock stops: in production it is released when the response ends.
func decide(b *testing.B, r *router.Router, body []byte) (timing, *router.Decision) {
	start := time.Now()
	req, err := openai.Parse(openai.ChatCompletions, body, openai.DefaultLimits())
	if err != nil {
		b.Fatal(err)
	}
	parsed := time.Now()
	d, err := r.Route(context.Background(), &router.Request{Model: req.Model, Chat: req.Chat, Prompt: req.Prompt, Tokens: req.Tokens, Body: body})
	if err != nil {
		b.Fatal(err)
	}
	if d.PromptFallback != "" {
		b.Fatalf("the prompt was not encoded: %s", d.PromptFallback)
	}
	return timing{total: time.Since(start), parse: parsed.Sub(start), stages: d.Timings}, d
}

// timing is one decision's duration, its parse stage and the router's stages.
type timing struct {
	total, parse time.Duration
	stages       router.Timings
}

// at returns the q-quantile of the decisions' of(timing), in µs.
func at(took []timing, q float64, of func(timing) time.Duration) float64 {
	d := make([]time.Duration, len(took))
	for i, t := range took {
		d[i] = of(t)
	}
	slices.Sort(d)
	return float64(d[int(q*float64(len(d)-1))].Nanoseconds()) / 1e3
}

// reportTotals reports the p50 and p99 of the decisions' durations.
func reportTotals(b *testing.B, took []timing) {
	total := func(t timing) time.Duration { return t.total }
	b.ReportMetric(at(took, 0.50, total), "p50-µs")
	b.ReportMetric(at(took, 0.99, total), "p99-µs")
}

// reportPercentiles reports the p50 and p99 of the decisions' durations, and the
// medians of their stages: parse, tokenize (render and encode), hash, lookup, and
// score (fill bookings, pick, book, record), with the p99s of parse, tokenize and score.
func reportPercentiles(b *testing.B, took []timing) {
	reportTotals(b, took)
	for _, stage := range []struct {
		name string
		of   func(timing) time.Duration
		p99  bool
	}{
		{"parse", func(t timing) time.Duration { return t.parse }, true},
		{"tokenize", func(t timing) time.Duration { return t.stages.Tokenize }, true},
		{"hash", func(t timing) time.Duration { return t.stages.Hash }, false},
		{"lookup", func(t timing) time.Duration { return t.stages.Lookup }, false},
		{"score", func(t timing) time.Duration { return t.stages.Score }, true},
	} {
		b.ReportMetric(at(took, 0.50, stage.of), stage.name+"-p50-µs")
		if stage.p99 {
			b.ReportMetric(at(took, 0.99, stage.of), stage.name+"-p99-µs")
		}
	}
}

// BenchmarkDecisionFromBodyTurn12 is a whole decision from the request body's bytes,
// on one goroutine, for turn 12 of a conversation of about 4,100 Qwen3 tokens whose
// turn 11 was routed before (the segment memo holds the system prompt and exchanges
// 1–10): what is new is the engine's answer to turn 11 (about 270 tokens kvroute never
// saw) and question 12. Each iteration has its own answer and question. 64 workers.
// ns/op also counts building the body and releasing the booking; p50-µs and p99-µs are
// the decision alone.
func BenchmarkDecisionFromBodyTurn12(b *testing.B) {
	r := decisionBench(b)
	_, d := decide(b, r, chatBody(b, upTo(10), 11)) // turn 11
	d.Release()
	turns := newNextTurns(b)
	var took []timing
	blocks := 0
	for i := 0; b.Loop(); i++ {
		body := turns.body(b, 1000+i, 100_000+i)
		t, d := decide(b, r, body)
		took = append(took, t)
		blocks = d.Blocks
		d.Release()
	}
	reportPercentiles(b, took)
	b.ReportMetric(float64(blocks*benchBlockSize), "prompt-tokens")
}

// BenchmarkDecisionFromBodyRepeat is the same decision for a body seen before (a retry,
// or the same prompt from another client): every segment comes from the memo.
func BenchmarkDecisionFromBodyRepeat(b *testing.B) {
	r := decisionBench(b)
	body := chatBody(b, upTo(11), 12)
	_, d := decide(b, r, body)
	d.Release()
	var took []timing
	for b.Loop() {
		t, d := decide(b, r, body)
		took = append(took, t)
		d.Release()
	}
	reportPercentiles(b, took)
}

// BenchmarkNoiseFloor times a fixed computation that allocates nothing (SHA-256 of 100
// KiB, ~55 µs) with the same per-iteration clock as the decision benchmarks: its p99 /
// p50 is what the machine alone adds to a tail, the yardstick for theirs.
func BenchmarkNoiseFloor(b *testing.B) {
	buf := make([]byte, 100<<10)
	var took []timing
	for b.Loop() {
		start := time.Now()
		sha256.Sum256(buf)
		took = append(took, timing{total: time.Since(start)})
	}
	reportTotals(b, took)
}

// BenchmarkNoiseFloorMemory is NoiseFloor for a computation bound by memory instead:
// 700 dependent loads at random places in 64 MiB (each a cache and TLB miss, ~140 µs),
// as the decision's index and tokenizer lookups are when out of cache. Its p99 − p50
// is what the machine adds to a tail that waits on memory.
func BenchmarkNoiseFloorMemory(b *testing.B) {
	const n = 8 << 20 // 64 MiB of uint64
	next := make([]uint64, n)
	order := rand.New(rand.NewPCG(1, 2)).Perm(n)
	for i := range order {
		next[order[i]] = uint64(order[(i+1)%n]) // one cycle through every slot
	}
	var took []timing
	at := uint64(order[0])
	for b.Loop() {
		start := time.Now()
		for range 700 {
			at = next[at]
		}
		took = append(took, timing{total: time.Since(start)})
	}
	if at >= n {
		b.Fatal("the walk left the array")
	}
	reportTotals(b, took)
}
