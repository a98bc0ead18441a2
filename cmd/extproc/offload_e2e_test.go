package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/explain"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/models"
)

// TestAPromptOffloadedToHostMemoryGoesWhereItCanBeLoaded: two simulated engines with a
// device cache of 32 blocks and a host tier of 512 (CPU offloading), publishing KV
// events over loopback ZMQ. One conversation is sent to w0 past kvroute, then two
// others push it off w0's device; its blocks stay in w0's host memory, which w0
// reports in medium CPU. Routed through Envoy (envoytest) and kvroute, the
// conversation goes to w0, whose trace shows the offloaded run and no device overlap,
// and w0's engine loads it. The host tier reports as vLLM's CPU offloading does (each
// block by the device's hash alone) and as LMCache does (chunks of four blocks, each
// with its tokens; its run is the whole chunks).
func TestAPromptOffloadedToHostMemoryGoesWhereItCanBeLoaded(t *testing.T) {
	for _, host := range []struct {
		name        string
		chunkBlocks int
	}{{"vLLM's blocks", 0}, {"LMCache's chunks", 4}} {
		t.Run(host.name, func(t *testing.T) { testOffloadedPrompt(t, host.chunkBlocks) })
	}
}

func testOffloadedPrompt(t *testing.T, chunkBlocks int) {
	workers := startEventWorkersOn(t, 2, nil, eventEngine{deviceBlocks: 32, hostBlocks: 512, hostChunkBlocks: chunkBlocks})
	cfg := eventsConfig(workers)
	cfg.Tokenizers = models.Config{models.DefaultKey: {Approx: true}}
	cfg.Explain = explain.Config{Enabled: true, Header: "x-why", SampleRate: 1, Buffer: 4}
	for i := range cfg.Router.Workers {
		cfg.Router.Workers[i].CapacityBlocks = 32
	}
	a, grpcAddr := serveBuilt(t, cfg)
	client := clientThroughEnvoy(t, grpcAddr)
	ctx := context.Background()

	w0 := workers[0]
	for _, w := range workers {
		require.Eventually(t, w.server.Events().Subscribed, 20*time.Second, 5*time.Millisecond)
	}
	// Both devices full, as in a fleet's steady state: w1 holds two other
	// conversations, so only the host run tells the workers apart.
	for i, topic := range []string{"billing", "legal", "search", "hiring", "storage"} {
		w := workers[i%2]
		_, err := w.client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen", Messages: ownMessages(topic), MaxTokens: openai.Int(2)})
		require.NoError(t, err)
	}
	blocks := ownPromptBlocks(t, "billing")
	require.Greater(t, len(blocks), 16, "a conversation takes more than half the device")
	grain := max(chunkBlocks, 1)
	wantRun := (len(blocks) - 1) / grain * grain // the blocks the engine stored, in whole chunks
	ov, run := make([]int, 1), make([]int, 1)
	require.Eventually(t, func() bool {
		a.index.ConfirmedOverlaps(blocks, []string{w0.name}, ov)
		a.index.Offloaded(blocks, []string{w0.name}, ov, run)
		return ov[0] == 0 && run[0] >= wantRun
	}, 20*time.Second, 5*time.Millisecond, "kvroute never saw billing leave w0's device for its host memory")
	assert.Zero(t, run[0]%grain, "a run of whole chunks")
	assert.Positive(t, metricValue(t, a, "kvroute_kvevents_offloaded_blocks", map[string]string{"worker": w0.name}))

	var resp *http.Response
	_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen", Messages: ownMessages("billing"), MaxTokens: openai.Int(2)},
		option.WithHeader("x-why", "1"), option.WithResponseInto(&resp))
	require.NoError(t, err)
	assert.Equal(t, w0.name, resp.Header.Get("x-served-by"), "the conversation goes where its history can be loaded")
	var tr explain.Trace
	require.NoError(t, json.Unmarshal([]byte(resp.Header.Get(explain.ResponseHeader)), &tr))
	byWorker := map[string]explain.Candidate{}
	for _, c := range tr.Candidates {
		byWorker[c.Worker] = c
	}
	require.Contains(t, byWorker, w0.name)
	assert.Zero(t, byWorker[w0.name].Overlap, "nothing of it left on w0's device")
	assert.GreaterOrEqual(t, byWorker[w0.name].OffloadedBlocks, wantRun)
	assert.Zero(t, byWorker["w1"].OffloadedBlocks)
	assert.Less(t, byWorker[w0.name].Cost, byWorker["w1"].Cost)
	assert.Positive(t, w0.server.HostTokens(), "and the engine loaded it from host memory")
}

// ownConversation is a conversation whose first block already differs by topic (the
// conversations of conversation() share their first one): 23 blocks of 16 tokens of
// the approximate tokenizer.
func ownConversation(topic string) (system, question string) {
	return strings.Repeat(topic+" first: you answer for the "+topic+" team, briefly. ", 16), "What does the " + topic + " team do?"
}

func ownMessages(topic string) []openai.ChatCompletionMessageParamUnion {
	system, question := ownConversation(topic)
	return []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system), openai.UserMessage(question)}
}

func ownPromptBlocks(t *testing.T, topic string) []uint64 {
	t.Helper()
	system, question := ownConversation(topic)
	p, err := router.Prompter{BlockSize: 16, Tokenizers: approxTokenizers()}.Prompt(context.Background(),
		&router.Request{Model: "qwen", Chat: tokenize.TextChat("system", system, "user", question)})
	require.NoError(t, err)
	return p.Blocks
}

// TestWithoutKVEventsTheHostTierIsGuessedFromTheDecisions: the same engines with host
// tiers, but kvroute hears no KV events (approximate mode). With
// index.approximate_offload the blocks a worker's capacity evicts from kvroute's own
// decisions count as offloaded, so a conversation pushed off its worker's device by
// later ones goes back to that worker, which loads it from host memory; without it
// kvroute sees no offloaded blocks at all.
func TestWithoutKVEventsTheHostTierIsGuessedFromTheDecisions(t *testing.T) {
	for _, guess := range []bool{true, false} {
		t.Run(fmt.Sprint("approximate_offload ", guess), func(t *testing.T) {
			workers := startEventWorkersOn(t, 2, nil, eventEngine{deviceBlocks: 32, hostBlocks: 512})
			cfg := eventsConfig(workers)
			cfg.Tokenizers = models.Config{models.DefaultKey: {Approx: true}}
			cfg.Explain = explain.Config{Enabled: true, Header: "x-why", SampleRate: 1, Buffer: 4}
			cfg.Index.ApproximateOffload = guess
			for i := range cfg.Router.Workers {
				cfg.Router.Workers[i].CapacityBlocks = 32
				cfg.Router.Workers[i].KVEvents = nil
			}
			_, grpcAddr := serveBuilt(t, cfg)
			client := clientThroughEnvoy(t, grpcAddr)
			ctx := context.Background()

			send := func(topic string) (servedBy string, tr explain.Trace) {
				var resp *http.Response
				_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "qwen", Messages: ownMessages(topic), MaxTokens: openai.Int(2)},
					option.WithHeader("x-why", "1"), option.WithResponseInto(&resp))
				require.NoError(t, err)
				require.NoError(t, json.Unmarshal([]byte(resp.Header.Get(explain.ResponseHeader)), &tr))
				return resp.Header.Get("x-served-by"), tr
			}
			first, _ := send("billing")
			// Four more conversations of 23 blocks on two workers of 32: whichever lands
			// on billing's worker pushes it off that worker's device.
			for _, topic := range []string{"legal", "search", "hiring", "storage"} {
				send(topic)
			}
			var home *eventWorker
			for _, w := range workers {
				if w.name == first {
					home = w
				}
			}
			require.NotNil(t, home)
			hostBefore := home.server.HostTokens()

			servedBy, tr := send("billing")
			byWorker := map[string]explain.Candidate{}
			for _, c := range tr.Candidates {
				byWorker[c.Worker] = c
			}
			if !guess {
				for _, c := range tr.Candidates {
					assert.Zero(t, c.OffloadedBlocks, "no offloaded blocks without events or the guess")
				}
				return
			}
			assert.Equal(t, first, servedBy, "the conversation goes back where its history was pushed to host memory")
			assert.Positive(t, byWorker[first].OffloadedBlocks)
			assert.Less(t, byWorker[first].Overlap, len(ownPromptBlocks(t, "billing"))-1, "not all of it left on that device")
			assert.Greater(t, home.server.HostTokens(), hostBefore, "and its engine loaded it from host memory")
		})
	}
}
