package mockworker

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/sim"
)

// eventsWorker starts a worker of engine that publishes its KV events, and returns its
// URL and a subscriber of them, subscribed before anything is published.
func eventsWorker(t *testing.T, engine sim.Config) (string, zmq4.Socket) {
	t.Helper()
	s, err := New(Config{Name: "w0", Engine: engine, Speed: 100, Seed: 1, Events: &kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0"}})
	require.NoError(t, err)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.Close(); s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	sub := zmq4.NewSub(ctx)
	t.Cleanup(func() { sub.Close() })
	require.NoError(t, sub.Dial(s.Events().Addr()))
	require.NoError(t, sub.SetOption(zmq4.OptionSubscribe, ""))
	require.Eventually(t, s.Events().Subscribed, 10*time.Second, time.Millisecond, "the subscription reached the worker")
	return srv.URL, sub
}

// With a host tier, the worker publishes the blocks it writes through to the host as
// vLLM's offloading connector does: BlockStored events of medium "CPU", next to the
// device's "GPU" ones.
func TestHostTierEventsArePublishedInTheCPUMedium(t *testing.T) {
	url, sub := eventsWorker(t, sim.Config{NumGPUBlocks: 256, BlockSize: 16, MaxNumSeqs: 8, MaxBatchedTokens: 2048, HostBlocks: 64})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("x"), option.WithMaxRetries(0))
	_, err := client.Completions.New(ctx, openai.CompletionNewParams{Model: "mock",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(strings.Repeat("tokens ", 50))}, MaxTokens: openai.Int(1)})
	require.NoError(t, err)

	stored := map[string][]uint64{} // medium → hashes stored
	dec := kvevents.NewDecoder()
	for len(stored["CPU"]) == 0 || len(stored["GPU"]) == 0 {
		msg, err := sub.Recv()
		require.NoError(t, err, "both tiers' stores were published")
		require.Len(t, msg.Frames, 3, "topic, seq, payload")
		b, err := dec.Decode(msg.Frames[2])
		require.NoError(t, err)
		for _, ev := range b.Events {
			if ev.Type == kvevents.TypeBlockStored {
				stored[ev.Medium] = append(stored[ev.Medium], ev.BlockHashes...)
			}
		}
	}
	assert.Equal(t, stored["GPU"], stored["CPU"], "every block the device caches is written through")
}
