package router_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/models"
)

// TestConcurrentDecisionsHashTheirOwnPrompts: a decision renders and encodes its prompt
// into pooled buffers (the embedded tokenizer and template can append), which later
// decisions reuse. Four goroutines route chats of very different lengths at once; after
// each decision the chosen worker holds every block of that chat as the unpooled path
// (Prompter.Prompt) hashes it, and the decision counts that many tokens. A buffer shared
// by two decisions, or a reused one not emptied first, would hash another prompt.
func TestConcurrentDecisionsHashTheirOwnPrompts(t *testing.T) {
	tokenizers, err := models.Load(nil, models.Deps{})
	require.NoError(t, err)
	idx, err := index.New(index.Config{CapacityBlocks: 1 << 20}, nil)
	require.NoError(t, err)
	var workers []router.Worker
	for w := range 4 {
		name := fmt.Sprintf("w%d", w)
		workers = append(workers, router.Worker{Name: name, Address: fmt.Sprintf("127.0.0.1:%d", 8000+w)})
		require.NoError(t, idx.SetWorker(name, 0))
	}
	picker, err := scoring.NewKVCost(scoring.DynamoParams(), nil)
	require.NoError(t, err)
	const blockSize = 16
	r, err := router.New(router.Config{BlockSize: blockSize, Workers: workers}, router.Deps{
		Tokenizers: tokenizers, Index: idx, Bookings: scoring.NewBookings(), Picker: picker, RecordBlocks: true})
	require.NoError(t, err)
	prompter := router.Prompter{BlockSize: blockSize, Tokenizers: tokenizers}

	chat := func(g, i int) *tokenize.Chat {
		words := strings.Repeat(fmt.Sprintf("goroutine %d asks question %d about caches. ", g, i), 1+(g*37+i*11)%90)
		return tokenize.TextChat("system", "You are terse.", "user", words)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 40 {
				req := &router.Request{Model: "Qwen/Qwen3-8B", Chat: chat(g, i)}
				want, err := prompter.Prompt(context.Background(), req)
				if !assert.NoError(t, err) || !assert.Empty(t, want.Fallback) {
					return
				}
				d, err := r.Route(context.Background(), req)
				if !assert.NoError(t, err) {
					return
				}
				assert.Equal(t, len(want.Tokens), d.PromptTokens, "goroutine %d, chat %d", g, i)
				assert.Equal(t, len(want.Blocks), d.Blocks, "goroutine %d, chat %d", g, i)
				held := make([]int, 1)
				idx.Overlaps(want.Blocks, []string{d.Worker}, held)
				assert.Equal(t, len(want.Blocks), held[0], "goroutine %d, chat %d: the chosen worker holds the blocks of another prompt", g, i)
				d.Release()
			}
		})
	}
	wg.Wait()
}
