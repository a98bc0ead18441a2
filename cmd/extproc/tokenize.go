package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tokenize/models"
)

// tokenizeOutput is what `extproc tokenize` prints: the prompt as the router sees it.
type tokenizeOutput struct {
	Model       string   `json:"model"`
	Tokenizer   string   `json:"tokenizer"`
	Prompt      string   `json:"prompt"`
	TokenIDs    []uint32 `json:"token_ids"`
	Blocks      int      `json:"blocks"`
	BlockHashes []uint64 `json:"block_hashes"`
	// Fallback is set when the router would route the request by load alone.
	Fallback string `json:"fallback,omitempty"`
	// EstimatedTokens is set when the prompt's encoding stopped early (max_prompt_tokens,
	// the tokenizer's bound on long words): TokenIDs are its first ids, and the router
	// counts this many more, estimated from the bytes left out.
	EstimatedTokens int `json:"estimated_tokens,omitempty"`
}

// maxTokenizeBody bounds the body read from stdin (max_body_bytes' own ceiling).
const maxTokenizeBody = 64 << 20

// runTokenize is `extproc tokenize [-config FILE] [-model NAME] [-tokenizer PATH]
// [-completions|-responses|-messages]`: it reads a request body on stdin and prints the prompt, its
// token ids and block hashes through the router's own parse, render, encode and hash
// (router.Prompter). It returns the exit code: 1 for a request the router would refuse
// (400) or a config or tokenizer that does not load, 2 for bad flags.
func runTokenize(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("extproc tokenize", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "kvroute YAML whose tokenizers, block_size and limits to use (default: every default)")
	model := fs.String("model", "", "model whose tokenizer to use and whose name salts the block hashes (default: the body's model)")
	tokenizer := fs.String("tokenizer", "", "a tokenizer.json, or a directory holding it with tokenizer_config.json, for every model (overrides the config's tokenizers)")
	completions := fs.Bool("completions", false, "read the body as a completions request (default: chat completions)")
	responses := fs.Bool("responses", false, "read the body as a Responses API request, rebuilt into the chat vLLM renders for it")
	messages := fs.Bool("messages", false, "read the body as an Anthropic Messages API request, rebuilt into the chat vLLM renders for it")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	kind := openai.ChatCompletions
	chosen := 0
	for _, f := range []struct {
		set  bool
		kind openai.Endpoint
	}{{*completions, openai.Completions}, {*responses, openai.Responses}, {*messages, openai.Messages}} {
		if f.set {
			kind = f.kind
			chosen++
		}
	}
	if chosen > 1 {
		fmt.Fprintln(stderr, "extproc tokenize: -completions, -responses and -messages exclude each other")
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "extproc tokenize: unexpected arguments %q (the body is read on stdin)\n", fs.Args())
		return 2
	}
	cfg := config.Default()
	if *path != "" {
		var err error
		if cfg, err = config.Load(*path); err != nil {
			fmt.Fprintf(stderr, "extproc tokenize: config %s: %v\n", *path, err)
			return 1
		}
	}
	if *tokenizer != "" {
		cfg.Tokenizers = models.Config{models.DefaultKey: {Path: *tokenizer}}
	}
	// A completions body needs no chat template: a bare tokenizer.json will do.
	set, err := loadTokenizers(cfg, slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError})), nil, kind == openai.Completions)
	if err != nil {
		fmt.Fprintf(stderr, "extproc tokenize: %v\n", err)
		return 1
	}
	body, err := io.ReadAll(io.LimitReader(stdin, maxTokenizeBody+1))
	if err != nil || len(body) > maxTokenizeBody {
		fmt.Fprintf(stderr, "extproc tokenize: reading the body on stdin: %v (at most %d bytes)\n", err, maxTokenizeBody)
		return 1
	}
	req, code := tokenizeRequest(body, cfg, kind, stderr)
	if code != 0 {
		return code
	}
	if *model != "" {
		req.Model = *model
	}
	p, err := router.Prompter{BlockSize: cfg.Router.BlockSize, Tokenizers: set}.Prompt(ctx, &req)
	if err != nil {
		fmt.Fprintf(stderr, "extproc tokenize: the request would be refused (400): %v\n", err)
		return 1
	}
	if p.Fallback != "" {
		fmt.Fprintf(stderr, "extproc tokenize: the prompt cannot be encoded (%s), so the router would route the request by load alone: %v\n", p.Fallback, p.FallbackErr)
	}
	if p.EstimatedTokens > 0 {
		fmt.Fprintf(stderr, "extproc tokenize: the prompt's encoding stopped early (max_prompt_tokens, or the tokenizer's bound on long words), so the router would route the request on its first %d ids, counting about %d tokens more\n", len(p.Tokens), p.EstimatedTokens)
	}
	out := tokenizeOutput{Model: req.Model, Tokenizer: set.Source(req.Model), Prompt: p.Text, TokenIDs: p.Tokens,
		Blocks: len(p.Blocks), BlockHashes: p.Blocks, Fallback: p.Fallback, EstimatedTokens: p.EstimatedTokens}
	if out.TokenIDs == nil {
		out.TokenIDs = []uint32{}
	}
	if out.BlockHashes == nil {
		out.BlockHashes = []uint64{}
	}
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(stderr, "extproc tokenize: %v\n", err)
		return 1
	}
	return 0
}

// tokenizeRequest reads body as the router's request of that kind would be read: a
// chat or completions body, or a Responses or Messages API body rebuilt into its chat.
// It returns a nonzero exit code for a body the router refuses (400), and says on
// stderr when a Responses or Messages body would be routed by load.
func tokenizeRequest(body []byte, cfg config.Config, kind openai.Endpoint, stderr io.Writer) (router.Request, int) {
	lim := openai.Limits{MaxDepth: cfg.Filter.MaxJSONDepth, MaxPromptTokens: cfg.Filter.MaxPromptTokens}
	refused := func(err error) (router.Request, int) {
		fmt.Fprintf(stderr, "extproc tokenize: the request would be refused (400): %v\n", err)
		return router.Request{}, 1
	}
	byLoad := func(req router.Request, err error) (router.Request, int) {
		if err != nil {
			fmt.Fprintf(stderr, "extproc tokenize: the prompt is not rebuilt, so the router would route the request by load alone: %v\n", err)
		}
		return req, 0
	}
	switch kind {
	case openai.Responses:
		parsed, err := openai.ParseResponses(body, lim)
		if err != nil {
			return refused(err)
		}
		return byLoad(filter.ResponsesRouteRequest(parsed, body, lim))
	case openai.Messages:
		parsed, err := openai.ParseMessages(body, lim)
		if err != nil {
			return refused(err)
		}
		return byLoad(filter.MessagesRouteRequest(parsed, body, lim))
	}
	parsed, err := openai.Parse(kind, body, lim)
	if err != nil {
		return refused(err)
	}
	return filter.RouteRequest(parsed, body), 0
}
