package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// drive runs the sessions through the data plane and fills res.
func drive(ctx context.Context, o options, baseURL string, res *result) error {
	client := openai.NewClient(option.WithBaseURL(baseURL+"/v1/"), option.WithAPIKey("demo"), option.WithMaxRetries(0),
		option.WithRequestTimeout(2*time.Minute))
	rng := rand.New(rand.NewPCG(o.seed, 1))
	total := o.sessions * o.turns
	var mu sync.Mutex
	done := 0
	progressBar(0, total)
	var wg sync.WaitGroup
	errs := make(chan error, o.sessions)
	scale := func(d time.Duration) time.Duration { return time.Duration(float64(d) / o.speed) }
	for range o.sessions {
		prefix := words(rng, o.prefixWords)
		start := scale(time.Duration(rng.Int64N(int64(8 * time.Second))))
		userTurns := make([]string, o.turns)
		thinks := make([]time.Duration, o.turns)
		for k := range userTurns {
			userTurns[k] = words(rng, o.userWords)
			thinks[k] = scale(250*time.Millisecond + time.Duration(rng.Int64N(int64(1500*time.Millisecond))))
		}
		wg.Go(func() {
			time.Sleep(start)
			history := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(prefix)}
			last := ""
			for k := range o.turns {
				history = append(history, openai.UserMessage(userTurns[k]))
				var httpResp *http.Response
				begin := time.Now()
				stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
					Model: "demo", Messages: history, MaxTokens: openai.Int(int64(o.outputTokens)),
					StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
				}, option.WithResponseInto(&httpResp))
				var ttft time.Duration
				var answer string
				var usage openai.CompletionUsage
				for stream.Next() {
					c := stream.Current()
					if len(c.Choices) > 0 && c.Choices[0].Delta.Content != "" {
						if ttft == 0 {
							ttft = time.Since(begin)
						}
						answer += c.Choices[0].Delta.Content
					}
					if c.Usage.PromptTokens > 0 {
						usage = c.Usage
					}
				}
				if err := stream.Err(); err != nil {
					errs <- err
					return
				}
				if httpResp == nil {
					errs <- errors.New("no response")
					return
				}
				served := httpResp.Header.Get("x-served-by")
				mu.Lock()
				res.ttft = append(res.ttft, ttft)
				res.promptTokens += usage.PromptTokens
				res.cachedTokens += usage.PromptTokensDetails.CachedTokens
				if k > 0 {
					res.resumed++
					res.resumedTTFT = append(res.resumedTTFT, ttft)
					if served != last {
						res.moved++
					}
				}
				done++
				progressBar(done, total)
				mu.Unlock()
				last = served
				history = append(history, openai.AssistantMessage(answer))
				time.Sleep(thinks[k])
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}
