package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/fakeworker"
	"github.com/kvroute/kvroute/mockworker"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/builtin"
	"github.com/kvroute/kvroute/tokenize/engine"
	"github.com/kvroute/kvroute/tokenize/models"
)

// tokenizeYAML is the config `extproc tokenize -config` reads in these tests: the
// deployments' block size, and no tokenizers section (the embedded default).
const tokenizeYAML = `
block_size: 4
workers: [{name: w, address: "127.0.0.1:1"}]
`

// tokenizeCmd runs `extproc tokenize args` on body and decodes what it prints.
func tokenizeCmd(t *testing.T, body string, args ...string) (tokenizeOutput, string, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := runTokenize(context.Background(), args, strings.NewReader(body), &stdout, &stderr)
	var out tokenizeOutput
	if code == 0 {
		require.NoError(t, json.Unmarshal(stdout.Bytes(), &out), stdout.String())
	}
	return out, stderr.String(), code
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
	return path
}

// chatBody is a conversation long enough for a few dozen blocks of 4 tokens.
const chatBody = `{"model":"qwen","messages":[{"role":"system","content":"You are the assistant of the platform team; answer briefly and cite the runbook."},` +
	`{"role":"user","content":"Our vLLM pods restart when the KV cache fills. Which flags should we look at first? 日本語も大丈夫 🙂"}],"max_tokens":2}`

// TestTokenizePrintsWhatTheRouterSees: the block hashes `extproc tokenize` prints for a
// body are those kvroute's router records for the same body sent through the data plane
// (embedded default tokenizer on both sides), and differ from another tokenizer's.
func TestTokenizePrintsWhatTheRouterSees(t *testing.T) {
	cfgFile := writeFile(t, t.TempDir(), "kvroute.yaml", tokenizeYAML)
	out, stderr, code := tokenizeCmd(t, chatBody, "-config", cfgFile)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, "qwen", out.Model)
	assert.Equal(t, "builtin:qwen3 (default)", out.Tokenizer)
	assert.True(t, strings.HasPrefix(out.Prompt, "<|im_start|>system\nYou are the assistant"), out.Prompt)
	assert.True(t, strings.HasSuffix(out.Prompt, "<|im_start|>assistant\n"), out.Prompt)
	assert.Equal(t, uint32(151644), out.TokenIDs[0], "<|im_start|> is one token")
	assert.Equal(t, len(out.TokenIDs)/4, out.Blocks)
	require.Len(t, out.BlockHashes, out.Blocks)
	require.Greater(t, out.Blocks, 10)

	d := deploy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, func(c *config.Config) { c.Tokenizers = nil })
	resp, err := http.Post(d.envoy.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	names := []string{"w0", "w1", "w2"}
	recorded := func(hashes []uint64) int {
		ov := make([]int, len(names))
		d.app.index.Overlaps(hashes, names, ov)
		return max(ov[0], ov[1], ov[2])
	}
	assert.Equal(t, out.Blocks, recorded(out.BlockHashes), "the router recorded exactly the printed blocks for its chosen worker")

	approxFile := writeFile(t, t.TempDir(), "approx.yaml", tokenizeYAML+"tokenizers: {default: {approx: true}}\n")
	other, _, code := tokenizeCmd(t, chatBody, "-config", approxFile)
	require.Equal(t, 0, code)
	assert.Equal(t, "approx (default)", other.Tokenizer)
	assert.Zero(t, recorded(other.BlockHashes), "another tokenizer's blocks are not the router's")
}

func TestTokenizeFlags(t *testing.T) {
	dir := t.TempDir()
	tokenizerJSON, err := builtin.TokenizerJSON("qwen3")
	require.NoError(t, err)
	tokenizerConfig, err := builtin.TokenizerConfigJSON("qwen3")
	require.NoError(t, err)
	writeFile(t, dir, "tokenizer.json", string(tokenizerJSON))
	writeFile(t, dir, "tokenizer_config.json", string(tokenizerConfig))
	cfgFile := writeFile(t, dir, "kvroute.yaml", tokenizeYAML)
	// bare has no tokenizer_config.json beside it; strict's template refuses chats not
	// opened by a user.
	bare := writeFile(t, t.TempDir(), "tokenizer.json", string(tokenizerJSON))
	strict := filepath.Join(dir, "strict")
	require.NoError(t, os.Mkdir(strict, 0o755))
	writeFile(t, strict, "tokenizer.json", string(tokenizerJSON))
	writeFile(t, strict, "tokenizer_config.json", string(tokenizerConfig))
	writeFile(t, strict, "chat_template.jinja", "{% if messages[0].role != 'user' %}{{ raise_exception('the first message must be the user\\'s') }}{% endif %}{{ messages[0].content }}")

	def, _, code := tokenizeCmd(t, chatBody, "-config", cfgFile)
	require.Equal(t, 0, code)
	require.NotZero(t, def.Blocks)
	noFlags, _, code := tokenizeCmd(t, chatBody)
	require.Equal(t, 0, code)
	assert.Equal(t, def.TokenIDs, noFlags.TokenIDs, "no flags: the embedded default")
	assert.Zero(t, noFlags.Blocks, "no flags: the default block size (64)")
	tests := []struct {
		name   string
		body   string
		args   []string
		check  func(t *testing.T, out tokenizeOutput)
		code   int
		stderr string
	}{
		{"-tokenizer a directory gives the embedded default's ids", chatBody, []string{"-tokenizer", dir, "-config", cfgFile}, func(t *testing.T, out tokenizeOutput) {
			assert.Equal(t, def.TokenIDs, out.TokenIDs)
			assert.Equal(t, def.BlockHashes, out.BlockHashes)
			assert.Equal(t, filepath.Join(dir, "tokenizer.json")+" (default)", out.Tokenizer)
		}, 0, ""},
		{"-model salts the block hashes", chatBody, []string{"-model", "other", "-config", cfgFile}, func(t *testing.T, out tokenizeOutput) {
			assert.Equal(t, "other", out.Model)
			assert.Equal(t, def.TokenIDs, out.TokenIDs)
			assert.NotEqual(t, def.BlockHashes[0], out.BlockHashes[0])
		}, 0, ""},
		{"-completions adds no chat template", `{"model":"qwen","prompt":"Hello world"}`, []string{"-completions"}, func(t *testing.T, out tokenizeOutput) {
			assert.Equal(t, "Hello world", out.Prompt)
			assert.Equal(t, []uint32{9707, 1879}, out.TokenIDs)
			assert.Zero(t, out.Blocks)
			assert.Equal(t, []uint64{}, out.BlockHashes)
		}, 0, ""},
		{"a completions prompt of ids is used as is", `{"model":"qwen","prompt":[1,2,3,4,5]}`, []string{"-completions", "-config", cfgFile}, func(t *testing.T, out tokenizeOutput) {
			assert.Equal(t, []uint32{1, 2, 3, 4, 5}, out.TokenIDs)
			assert.Equal(t, 1, out.Blocks, "one full block of the config's 4 tokens")
		}, 0, ""},
		{"media content is routed by load", `{"model":"qwen","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/y.png"}}]}]}`, nil,
			func(t *testing.T, out tokenizeOutput) {
				assert.Equal(t, "unsupported_content", out.Fallback)
				assert.Equal(t, []uint32{}, out.TokenIDs)
			}, 0, "route the request by load alone"},
		{"a body the router refuses", `{"model":"qwen","messages":[]}`, nil, nil, 1, "would be refused (400)"},
		{"a chat the template refuses", `{"model":"qwen","messages":[{"role":"tool","content":"x"}]}`, []string{"-tokenizer", strict}, nil, 1, "would be refused (400)"},
		{"a chat the template accepts", `{"model":"qwen","messages":[{"role":"user","content":"Hello world"}]}`, []string{"-tokenizer", strict}, func(t *testing.T, out tokenizeOutput) {
			assert.Equal(t, "Hello world", out.Prompt)
			assert.Equal(t, []uint32{9707, 1879}, out.TokenIDs, "the directory's chat_template.jinja")
		}, 0, ""},
		{"not JSON", `{`, nil, nil, 1, "would be refused (400)"},
		{"-completions needs no chat template beside tokenizer.json", `{"model":"qwen","prompt":"Hello world"}`, []string{"-completions", "-tokenizer", bare}, func(t *testing.T, out tokenizeOutput) {
			assert.Equal(t, []uint32{9707, 1879}, out.TokenIDs)
		}, 0, ""},
		{"a chat does", chatBody, []string{"-tokenizer", bare}, nil, 1, "no tokenizer_config.json"},
		{"a tokenizer that is not there", chatBody, []string{"-tokenizer", filepath.Join(dir, "nope")}, nil, 1, "tokenizers.default.path:"},
		{"a config that does not load", chatBody, []string{"-config", filepath.Join(dir, "nope.yaml")}, nil, 1, "config"},
		{"an unknown flag", chatBody, []string{"-x"}, nil, 2, "flag provided but not defined"},
		{"an argument", chatBody, []string{"body.json"}, nil, 2, "the body is read on stdin"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, stderr, code := tokenizeCmd(t, tt.body, tt.args...)
			require.Equal(t, tt.code, code, stderr)
			assert.Contains(t, stderr, tt.stderr)
			if tt.check != nil {
				tt.check(t, out)
			}
		})
	}
}

// TestEngineModeRoutesByLoadWhenTheRenderServerFails: a model in engine mode is
// tokenized by a render server (a mock worker's render endpoints, tokenizing with the
// embedded Qwen3 while kvroute's own default is the approximate pair); requests are
// routed on the server's ids while it answers, and by load, never failed, once it is
// gone.
func TestEngineModeRoutesByLoadWhenTheRenderServerFails(t *testing.T) {
	qwen3, err := models.Load(nil, models.Deps{})
	require.NoError(t, err)
	renderer, err := mockworker.New(mockworker.Config{Name: "render", Engine: sim.Config{NumGPUBlocks: 64, BlockSize: 16, MaxNumSeqs: 4, MaxBatchedTokens: 1024},
		Speed: 50, Seed: 1, Tokenizers: qwen3})
	require.NoError(t, err)
	t.Cleanup(renderer.Close)
	srv := httptest.NewServer(renderer.Handler())
	t.Cleanup(srv.Close)

	d := deploy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, func(c *config.Config) {
		c.Tokenizers["qwen"] = models.Entry{Engine: &engine.Config{URL: srv.URL, Timeout: 10 * time.Second}}
	})
	post := func() {
		t.Helper()
		resp, err := http.Post(d.envoy.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	post()
	metrics := d.scrape(t)
	assert.Contains(t, metrics, `kvroute_engine_renders_total{model="qwen",outcome="ok"} 1`)
	assert.Contains(t, metrics, `kvroute_router_prompt_fallbacks_total{reason="engine"} 0`)
	chat, err := openai.Parse(openai.ChatCompletions, []byte(chatBody), openai.DefaultLimits())
	require.NoError(t, err)
	want, err := router.Prompter{BlockSize: 4, Tokenizers: qwen3}.Prompt(context.Background(), &router.Request{Model: "qwen", Chat: chat.Chat})
	require.NoError(t, err)
	require.NotEmpty(t, want.Blocks)
	ov := make([]int, 3)
	d.app.index.Overlaps(want.Blocks, []string{"w0", "w1", "w2"}, ov)
	assert.Equal(t, len(want.Blocks), max(ov[0], ov[1], ov[2]), "the decision hashed the render server's ids")

	srv.Close()
	post()
	metrics = d.scrape(t)
	assert.Contains(t, metrics, `kvroute_engine_renders_total{model="qwen",outcome="unreachable"} 1`)
	assert.Contains(t, metrics, `kvroute_router_prompt_fallbacks_total{reason="engine"} 1`)
}

// TestEngineModeRendersResponsesAndMessagesBodies: for a model in engine mode (a mock
// worker's render endpoints, tokenizing with the embedded Qwen3; kvroute has no
// tokenizer of its own for it), a Responses API body and an Anthropic Messages API body
// are posted as they came to /v1/responses/render and /v1/messages/render, and routed
// on the ids they answer: kvroute records exactly the blocks of the render of their
// chat twin. A Responses body naming a stored response is not sent to render.
func TestEngineModeRendersResponsesAndMessagesBodies(t *testing.T) {
	qwen3, err := models.Load(nil, models.Deps{})
	require.NoError(t, err)
	renderer, err := mockworker.New(mockworker.Config{Name: "render", Engine: sim.Config{NumGPUBlocks: 64, BlockSize: 16, MaxNumSeqs: 4, MaxBatchedTokens: 1024},
		Speed: 50, Seed: 1, Tokenizers: qwen3})
	require.NoError(t, err)
	t.Cleanup(renderer.Close)
	var mu sync.Mutex
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		renderer.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	chat, err := openai.Parse(openai.ChatCompletions, []byte(chatBody), openai.DefaultLimits())
	require.NoError(t, err)
	twin, err := router.Prompter{BlockSize: 4, Tokenizers: qwen3}.Prompt(context.Background(), &router.Request{Model: "qwen", Chat: chat.Chat})
	require.NoError(t, err)
	require.NotEmpty(t, twin.Blocks)

	const system, user = "You are the assistant of the platform team; answer briefly and cite the runbook.",
		"Our vLLM pods restart when the KV cache fills. Which flags should we look at first? 日本語も大丈夫 🙂"
	tests := []struct {
		name, path, body, renderPath string
	}{
		{"responses", "/v1/responses", `{"model":"qwen","store":false,"max_output_tokens":2,"instructions":"` + system + `",` +
			`"input":[{"role":"user","content":[{"type":"input_text","text":"` + user + `"}]}]}`, "/v1/responses/render"},
		{"messages", "/v1/messages", `{"model":"qwen","max_tokens":2,"system":[{"type":"text","text":"` + system + `"}],` +
			`"messages":[{"role":"user","content":[{"type":"text","text":"` + user + `"}]}]}`, "/v1/messages/render"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mu.Lock()
			paths = nil
			mu.Unlock()
			d := deploy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, func(c *config.Config) {
				c.Tokenizers["qwen"] = models.Entry{Engine: &engine.Config{URL: srv.URL, Timeout: 10 * time.Second}}
			})
			resp, err := http.Post(d.envoy.URL+tt.path, "application/json", strings.NewReader(tt.body))
			require.NoError(t, err)
			reply, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode, string(reply))
			mu.Lock()
			assert.Equal(t, []string{tt.renderPath}, paths, "the body went to its API's render endpoint")
			mu.Unlock()
			metrics := d.scrape(t)
			assert.Contains(t, metrics, `kvroute_engine_renders_total{model="qwen",outcome="ok"} 1`)
			assert.Contains(t, metrics, `kvroute_router_prompt_fallbacks_total{reason="unsupported_content"} 0`)
			assert.Contains(t, metrics, `kvroute_filter_requests_total{outcome="routed"} 1`)
			ov := make([]int, 3)
			d.app.index.Overlaps(twin.Blocks, []string{"w0", "w1", "w2"}, ov)
			assert.Equal(t, len(twin.Blocks), max(ov[0], ov[1], ov[2]), "the decision hashed the render of the chat twin")
		})
	}

	t.Run("a stored response is not rendered", func(t *testing.T) {
		mu.Lock()
		paths = nil
		mu.Unlock()
		d := deploy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, func(c *config.Config) {
			c.Tokenizers["qwen"] = models.Entry{Engine: &engine.Config{URL: srv.URL, Timeout: 10 * time.Second}}
		})
		resp, err := http.Post(d.envoy.URL+"/v1/responses", "application/json",
			strings.NewReader(`{"model":"qwen","store":false,"input":"next","previous_response_id":"resp_1"}`))
		require.NoError(t, err)
		resp.Body.Close()
		mu.Lock()
		assert.Empty(t, paths, "vLLM's render refuses previous_response_id: not asked")
		mu.Unlock()
		assert.NotContains(t, d.scrape(t), `kvroute_engine_renders_total{model="qwen"`)
	})
}

// TestDefaultTokenizerWaitsForAModelWithoutAnEntry: when every worker lists its models
// and each has a tokenizers entry, kvroute starts without loading the embedded default;
// a reload that adds a worker for a model without an entry makes its first request load
// it, once, and that request is routed on the default's (Qwen3's) ids, as it would have
// been with the default loaded at start.
func TestDefaultTokenizerWaitsForAModelWithoutAnEntry(t *testing.T) {
	logs := &lockedBuffer{}
	d := deployLogging(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, func(c *config.Config) {
		c.Tokenizers = models.Config{"qwen": {Approx: true}}
	}, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	defer d.stop()
	post := func(model string) {
		t.Helper()
		body := strings.Replace(chatBody, `"model":"qwen"`, `"model":"`+model+`"`, 1)
		resp, err := http.Post(d.envoy.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	post("qwen")
	assert.NotContains(t, logs.String(), "loaded the default tokenizer")
	assert.Contains(t, d.scrape(t), `kvroute_tokenize_memo_misses_total{tokenizer="builtin:qwen3"} 0`)

	newcomer := fakeworker.New("w3")
	t.Cleanup(newcomer.Close)
	d.workers[newcomer.Name], d.byAddress[newcomer.Address] = newcomer, newcomer.Name
	next := d.running(t)
	next.Router.Workers = append(slices.Clone(next.Router.Workers), router.Worker{Name: "w3", Address: newcomer.Address, Models: []string{"other"}})
	status, summary := d.postReload(t, next, nil)
	require.Equal(t, http.StatusOK, status, summary)
	post("other")
	post("other")
	assert.Equal(t, 1, strings.Count(logs.String(), "loaded the default tokenizer"), logs.String())
	metrics := d.scrape(t)
	assert.Contains(t, metrics, `kvroute_router_prompt_fallbacks_total{reason="error"} 0`)
	assert.NotContains(t, metrics, `kvroute_tokenize_memo_misses_total{tokenizer="builtin:qwen3"} 0`)

	enc, err := d.app.tokenizers.Model("other").EncodePrompt(context.Background(), tokenize.Prompt{Text: "Hello world"})
	require.NoError(t, err)
	require.Equal(t, []uint32{9707, 1879}, enc.IDs, "the default is Qwen3")
	body := strings.Replace(chatBody, `"model":"qwen"`, `"model":"other"`, 1)
	chat, err := openai.Parse(openai.ChatCompletions, []byte(body), openai.DefaultLimits())
	require.NoError(t, err)
	want, err := router.Prompter{BlockSize: 4, Tokenizers: d.app.tokenizers}.Prompt(context.Background(), &router.Request{Model: "other", Chat: chat.Chat})
	require.NoError(t, err)
	require.NotEmpty(t, want.Blocks)
	ov := make([]int, 1)
	d.app.index.Overlaps(want.Blocks, []string{"w3"}, ov)
	assert.Equal(t, len(want.Blocks), ov[0], "the decision hashed the default's ids")
}

// TestTokenizeHonoursAddSpecialTokens: a completions request's add_special_tokens
// false leaves out the BOS its tokenizer's post-processor adds, as vLLM does; without
// it the BOS is there. Mistral-7B's tokenizer adds "<s>" (id 1).
func TestTokenizeHonoursAddSpecialTokens(t *testing.T) {
	gz, err := os.ReadFile(filepath.Join("..", "..", "tokenize", "hf", "testdata", "models", "mistral7b", "tokenizer.json.gz"))
	require.NoError(t, err)
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	require.NoError(t, err)
	data, err := io.ReadAll(zr)
	require.NoError(t, err)
	path := writeFile(t, t.TempDir(), "tokenizer.json", string(data))

	with, stderr, code := tokenizeCmd(t, `{"model":"m","prompt":"Hello world"}`, "-completions", "-tokenizer", path)
	require.Equal(t, 0, code, stderr)
	require.NotEmpty(t, with.TokenIDs)
	assert.Equal(t, uint32(1), with.TokenIDs[0], "the BOS by default")

	without, stderr, code := tokenizeCmd(t, `{"model":"m","prompt":"Hello world","add_special_tokens":false}`, "-completions", "-tokenizer", path)
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, with.TokenIDs[1:], without.TokenIDs, "no BOS with add_special_tokens false")
}

// TestAResponsesRequestRecordsTheBlocksOfItsChatTwin: a Responses API body sent through
// the data plane is routed on the prompt of the chat-completions body vLLM turns it
// into (instructions as the system message, input_text parts as text): kvroute records
// exactly the blocks `extproc tokenize` prints for that chat (embedded default
// tokenizer), so a conversation's blocks are the same whichever API an agent speaks.
func TestAResponsesRequestRecordsTheBlocksOfItsChatTwin(t *testing.T) {
	cfgFile := writeFile(t, t.TempDir(), "kvroute.yaml", tokenizeYAML)
	twin, stderr, code := tokenizeCmd(t, chatBody, "-config", cfgFile)
	require.Equal(t, 0, code, stderr)
	responsesBody := `{"model":"qwen","store":false,"max_output_tokens":2,` +
		`"instructions":"You are the assistant of the platform team; answer briefly and cite the runbook.",` +
		`"input":[{"role":"user","content":[{"type":"input_text","text":"Our vLLM pods restart when the KV cache fills. Which flags should we look at first? 日本語も大丈夫 🙂"}]}]}`

	d := deploy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, func(c *config.Config) { c.Tokenizers = nil })
	resp, err := http.Post(d.envoy.URL+"/v1/responses", "application/json", strings.NewReader(responsesBody))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	names := []string{"w0", "w1", "w2"}
	ov := make([]int, len(names))
	d.app.index.Overlaps(twin.BlockHashes, names, ov)
	assert.Equal(t, twin.Blocks, max(ov[0], ov[1], ov[2]), "the Responses request recorded its chat twin's blocks")
	assert.Contains(t, d.scrape(t), `kvroute_filter_requests_total{outcome="routed"} 1`)

	// `extproc tokenize -responses` prints what the router saw.
	out, stderr, code := tokenizeCmd(t, responsesBody, "-config", cfgFile, "-responses")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, twin.BlockHashes, out.BlockHashes)
	assert.Equal(t, twin.Prompt, out.Prompt)
	// One it would route by load says so, and prints no blocks.
	out, stderr, code = tokenizeCmd(t, `{"model":"qwen","input":"x","previous_response_id":"resp_1"}`, "-config", cfgFile, "-responses")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "route the request by load alone")
	assert.Empty(t, out.BlockHashes)
	_, _, code = tokenizeCmd(t, responsesBody, "-responses", "-completions")
	assert.Equal(t, 2, code)
}

// TestAMessagesRequestRecordsTheBlocksOfItsChatTwin: an Anthropic Messages API body sent
// through the data plane is routed on the prompt of the chat-completions body vLLM
// turns it into (its system text blocks as the system message, a lone text block as
// string content): kvroute records exactly the blocks `extproc tokenize` prints for
// that chat (embedded default tokenizer), so Claude Code's conversations are routed by
// prefix as chat completions are.
func TestAMessagesRequestRecordsTheBlocksOfItsChatTwin(t *testing.T) {
	cfgFile := writeFile(t, t.TempDir(), "kvroute.yaml", tokenizeYAML)
	twin, stderr, code := tokenizeCmd(t, chatBody, "-config", cfgFile)
	require.Equal(t, 0, code, stderr)
	messagesBody := `{"model":"qwen","max_tokens":2,` +
		`"system":[{"type":"text","text":"You are the assistant of the platform team; answer briefly and cite the runbook."}],` +
		`"messages":[{"role":"user","content":[{"type":"text","text":"Our vLLM pods restart when the KV cache fills. Which flags should we look at first? 日本語も大丈夫 🙂"}]}]}`

	d := deploy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, func(c *config.Config) { c.Tokenizers = nil })
	resp, err := http.Post(d.envoy.URL+"/v1/messages", "application/json", strings.NewReader(messagesBody))
	require.NoError(t, err)
	reply, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(reply))
	assert.Contains(t, string(reply), `"type":"message"`, "a worker answered as vLLM's /v1/messages")
	names := []string{"w0", "w1", "w2"}
	ov := make([]int, len(names))
	d.app.index.Overlaps(twin.BlockHashes, names, ov)
	assert.Equal(t, twin.Blocks, max(ov[0], ov[1], ov[2]), "the Messages request recorded its chat twin's blocks")
	assert.Contains(t, d.scrape(t), `kvroute_filter_requests_total{outcome="routed"} 1`)

	// `extproc tokenize -messages` prints what the router saw.
	out, stderr, code := tokenizeCmd(t, messagesBody, "-config", cfgFile, "-messages")
	require.Equal(t, 0, code, stderr)
	assert.Equal(t, twin.BlockHashes, out.BlockHashes)
	assert.Equal(t, twin.Prompt, out.Prompt)
	// One it would route by load (an image kvroute does not render) says so, and prints
	// no blocks; one it would refuse exits 1.
	out, stderr, code = tokenizeCmd(t, `{"model":"qwen","max_tokens":2,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}]}]}`,
		"-config", cfgFile, "-messages")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "route the request by load alone")
	assert.Empty(t, out.BlockHashes)
	_, _, code = tokenizeCmd(t, `{"max_tokens":2,"messages":[]}`, "-config", cfgFile, "-messages")
	assert.Equal(t, 1, code, "no model: refused")
	_, _, code = tokenizeCmd(t, messagesBody, "-messages", "-responses")
	assert.Equal(t, 2, code)
}

// TestToolsExcludedWhenToolChoiceIsNone: for a model whose vLLM server runs with
// --exclude-tools-when-tool-choice-none, `tokenizers.<model>.exclude_tools_when_tool_choice_none`
// makes a chat with tools and tool_choice "none" route on the prompt of the same chat
// without tools, which is what that server renders: through the data plane (the blocks
// recorded are the toolless twin's) and in `extproc tokenize -config`, for the chat
// completion and for the Responses and Messages bodies vLLM renders as chats. Without
// the key, the tools stay in the prompt, as vLLM's default renders them.
func TestToolsExcludedWhenToolChoiceIsNone(t *testing.T) {
	dir := t.TempDir()
	onFile := writeFile(t, dir, "on.yaml", tokenizeYAML+"tokenizers:\n  qwen:\n    builtin: qwen3\n    exclude_tools_when_tool_choice_none: true\n")
	offFile := writeFile(t, dir, "off.yaml", tokenizeYAML+"tokenizers:\n  qwen:\n    builtin: qwen3\n")
	const tool = `"name":"read_runbook","description":"Read a runbook page.","parameters":{"type":"object","properties":{"page":{"type":"string"}}}`
	withTools := strings.TrimSuffix(chatBody, "}") + `,"tools":[{"type":"function","function":{` + tool + `}}],"tool_choice":"none"}`
	twin, stderr, code := tokenizeCmd(t, chatBody, "-config", onFile)
	require.Equal(t, 0, code, stderr)
	require.NotContains(t, twin.Prompt, "read_runbook")

	d := deploy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, func(c *config.Config) {
		c.Tokenizers = models.Config{"qwen": {Builtin: "qwen3", ExcludeToolsWhenToolChoiceNone: true}}
	})
	resp, err := http.Post(d.envoy.URL+"/v1/chat/completions", "application/json", strings.NewReader(withTools))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	names := []string{"w0", "w1", "w2"}
	ov := make([]int, len(names))
	d.app.index.Overlaps(twin.BlockHashes, names, ov)
	assert.Equal(t, twin.Blocks, max(ov[0], ov[1], ov[2]), "the chat recorded the blocks of its twin without tools")

	responsesBody := `{"model":"qwen","store":false,"instructions":"You are the assistant of the platform team; answer briefly and cite the runbook.",` +
		`"input":"Our vLLM pods restart when the KV cache fills. Which flags should we look at first? 日本語も大丈夫 🙂",` +
		`"tools":[{"type":"function",` + tool + `}],"tool_choice":"none"}`
	messagesBody := `{"model":"qwen","max_tokens":2,"system":"You are the assistant of the platform team; answer briefly and cite the runbook.",` +
		`"messages":[{"role":"user","content":"Our vLLM pods restart when the KV cache fills. Which flags should we look at first? 日本語も大丈夫 🙂"}],` +
		`"tools":[{"name":"read_runbook","description":"Read a runbook page.","input_schema":{"type":"object","properties":{"page":{"type":"string"}}}}],` +
		`"tool_choice":{"type":"none"}}`
	for _, tt := range []struct {
		name, body, flag string
	}{
		{"chat completions", withTools, ""},
		{"responses", responsesBody, "-responses"},
		{"messages", messagesBody, "-messages"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := func(cfg string) []string {
				if tt.flag == "" {
					return []string{"-config", cfg}
				}
				return []string{"-config", cfg, tt.flag}
			}
			on, stderr, code := tokenizeCmd(t, tt.body, args(onFile)...)
			require.Equal(t, 0, code, stderr)
			assert.Equal(t, twin.Prompt, on.Prompt)
			assert.Equal(t, twin.BlockHashes, on.BlockHashes)
			off, stderr, code := tokenizeCmd(t, tt.body, args(offFile)...)
			require.Equal(t, 0, code, stderr)
			assert.Contains(t, off.Prompt, "read_runbook", "without the key the tools are rendered")
		})
	}
}
