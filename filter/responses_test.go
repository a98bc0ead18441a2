package filter_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/explain"
	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tokenize"
)

// responseIDPattern finds a fake worker's response id (resp_<worker>_<n>) in a JSON
// response or in a stream's response.created event.
var responseIDPattern = regexp.MustCompile(`"id":"(resp_[^"]+)"`)

// TestResponsesChainsStayOnTheWorkerThatStoredThem: each engine keeps its Responses API
// responses in its own memory (the fake workers as vLLM), so a chain of turns naming
// previous_response_id, and GET and cancel of a response, must reach the worker that
// stored it: any other answers 404. kvroute reads each response's id as it passes, in
// every body mode that shows it the response.
func TestResponsesChainsStayOnTheWorkerThatStoredThem(t *testing.T) {
	const B, FD, S = extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_STREAMED
	for _, modes := range [][2]extprocfilterv3.ProcessingMode_BodySendMode{{B, S}, {B, B}, {FD, FD}, {B, FD}, {FD, S}} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s_%s_stream=%v", modes[0], modes[1], stream), func(t *testing.T) {
				cfg := explain.DefaultConfig()
				cfg.Enabled = true
				p := newPlane(t, planeOptions{workers: 3, responses: true, reqMode: modes[0], respMode: modes[1], explain: cfg})
				id := ""
				for turn := range 6 {
					body := fmt.Sprintf(`{"model":"m","input":"turn %d","stream":%v}`, turn, stream)
					if id != "" {
						body = fmt.Sprintf(`{"model":"m","input":"turn %d","stream":%v,"previous_response_id":%q}`, turn, stream, id)
					}
					resp, out := p.post(t, "/v1/responses", body, "x-kvroute-explain", "1")
					require.Equal(t, http.StatusOK, resp.StatusCode, "turn %d: %s", turn, out)
					if id != "" {
						assert.Contains(t, resp.Header.Get(explain.ResponseHeader), `"stored_response":"stored_worker"`, "the trace says why")
					}
					m := responseIDPattern.FindStringSubmatch(out)
					require.NotNil(t, m, out)
					id = m[1]
				}
				storing := p.storedBy(t, id)
				for _, tc := range []struct{ method, path string }{
					{http.MethodGet, "/v1/responses/" + id},
					{http.MethodPost, "/v1/responses/" + id + "/cancel"},
					// The fake, as vLLM, serves no DELETE (405): its worker answers it.
					{http.MethodDelete, "/v1/responses/" + id},
				} {
					req, err := http.NewRequest(tc.method, p.envoy.URL+tc.path, nil)
					require.NoError(t, err)
					resp, err := p.envoy.Client().Do(req)
					require.NoError(t, err)
					resp.Body.Close()
					// A finished response cannot be cancelled (vLLM's 400): not a 404.
					assert.NotEqual(t, http.StatusNotFound, resp.StatusCode, tc.path)
					assert.Equal(t, storing, resp.Header.Get("x-served-by"), tc.path)
				}
				m := p.storedResponseRequests(t)
				assert.Equal(t, 8.0, m["stored_worker"], "5 turns, GET, cancel and DELETE")
				assert.Zero(t, m["unknown"])
			})
		}
	}
}

// TestResponsesKvrouteDidNotSeeStoredAreRoutedByLoad: a response kvroute could not read
// (response_body_mode NONE), one the engine did not store (store false) and one of an
// id never seen are routed by load, and counted so.
func TestResponsesKvrouteDidNotSeeStoredAreRoutedByLoad(t *testing.T) {
	tests := []struct {
		name     string
		respMode extprocfilterv3.ProcessingMode_BodySendMode
		first    string
	}{
		{"response body not shown to kvroute", extprocfilterv3.ProcessingMode_NONE, `{"model":"m","input":"x"}`},
		{"store false", extprocfilterv3.ProcessingMode_STREAMED, `{"model":"m","input":"x","store":false}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{workers: 3, responses: true, reqMode: extprocfilterv3.ProcessingMode_BUFFERED, respMode: tt.respMode})
			resp, out := p.post(t, "/v1/responses", tt.first)
			require.Equal(t, http.StatusOK, resp.StatusCode, out)
			id := responseIDPattern.FindStringSubmatch(out)[1]
			p.post(t, "/v1/responses", fmt.Sprintf(`{"model":"m","input":"y","previous_response_id":%q}`, id))
			m := p.storedResponseRequests(t)
			assert.Equal(t, 1.0, m["unknown"])
			assert.Zero(t, m["stored_worker"])
		})
	}
}

// TestResponsesBodiesAreChecked: a Responses API body kvroute reads is held to what it
// needs of it: an OpenAI error naming the field, before any worker sees it.
func TestResponsesBodiesAreChecked(t *testing.T) {
	tests := []struct {
		name, body string
		status     int
		param      string
	}{
		{"not JSON", `{"model":`, 400, ""},
		{"no model", `{"input":"x"}`, 400, "model"},
		{"previous_response_id not a string", `{"model":"m","input":"x","previous_response_id":7}`, 400, "previous_response_id"},
		{"a model no worker serves", `{"model":"other","input":"x"}`, 404, "model"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPlane(t, planeOptions{workers: 2, responses: true, models: [][]string{{"m"}, {"m"}}})
			resp, out := p.post(t, "/v1/responses", tt.body)
			assert.Equal(t, tt.status, resp.StatusCode, out)
			if tt.param != "" {
				assert.Contains(t, out, fmt.Sprintf(`"param":%q`, tt.param))
			}
			for _, w := range p.workers {
				assert.Zero(t, w.count(), "no worker was sent it")
			}
		})
	}
}

// TestResponsesPathsOffRouteByLoadUnread: with responses_paths empty, /v1/responses is
// another path: routed by load at its headers, its body not read.
func TestResponsesPathsOffRouteByLoadUnread(t *testing.T) {
	p := newPlane(t, planeOptions{workers: 2, responses: true, filterCfg: func(c *filter.Config) { c.ResponsesPaths = nil }})
	resp, out := p.post(t, "/v1/responses", `{"model":"m","input":"x","previous_response_id":7}`)
	// A worker answers the malformed id itself: kvroute did not read the body.
	assert.NotEmpty(t, resp.Header.Get("x-served-by"), out)
	assert.Zero(t, p.storedResponseRequests(t)["unknown"])
}

// storedBy names the worker that stored the response id.
func (p *plane) storedBy(t *testing.T, id string) string {
	t.Helper()
	for _, w := range p.workers {
		for _, stored := range w.StoredResponses() {
			if stored == id {
				return w.name
			}
		}
	}
	t.Fatalf("no worker stored %s", id)
	return ""
}

// storedResponseRequests reads kvroute_router_stored_response_requests_total by its
// routed label.
func (p *plane) storedResponseRequests(t *testing.T) map[string]float64 {
	t.Helper()
	families, err := p.registry.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "kvroute_router_stored_response_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "routed" {
					out[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// TestResponsesIdsAreLearnedWhenTheRequestBodyIsNotRead: an Envoy that shows kvroute no
// request body (STREAMED, against the config) gets its Responses POSTs routed by load
// at their headers, unpinned; their responses' ids are still read, so a GET of one goes
// to the worker that stored it.
func TestResponsesIdsAreLearnedWhenTheRequestBodyIsNotRead(t *testing.T) {
	p := newPlane(t, planeOptions{workers: 3, responses: true, reqMode: extprocfilterv3.ProcessingMode_STREAMED,
		respMode: extprocfilterv3.ProcessingMode_STREAMED, filterCfg: func(c *filter.Config) { c.RequestBodyMode = filter.ModeBuffered }})
	for range 3 {
		resp, out := p.post(t, "/v1/responses", `{"model":"m","input":"x"}`)
		require.Equal(t, http.StatusOK, resp.StatusCode, out)
		id := responseIDPattern.FindStringSubmatch(out)[1]
		req, err := http.NewRequest(http.MethodGet, p.envoy.URL+"/v1/responses/"+id, nil)
		require.NoError(t, err)
		got, err := p.envoy.Client().Do(req)
		require.NoError(t, err)
		got.Body.Close()
		assert.Equal(t, http.StatusOK, got.StatusCode)
		assert.Equal(t, p.storedBy(t, id), got.Header.Get("x-served-by"))
	}
	assert.Equal(t, 3.0, p.storedResponseRequests(t)["stored_worker"])
}

// TestResponsesConversationsResentWholeAreRoutedByPrefix: an agent that resends its
// whole conversation each turn (no previous_response_id, store false: Codex's way) is
// routed on the prompt vLLM renders from it, so each turn goes to the worker holding the
// previous one's prefix, though the others are idle.
func TestResponsesConversationsResentWholeAreRoutedByPrefix(t *testing.T) {
	cfg := explain.DefaultConfig()
	cfg.Enabled = true
	p := newPlane(t, planeOptions{workers: 3, responses: true, explain: cfg})
	instructions := strings.Repeat("You review pull requests for a Go router. ", 20)
	input := []string{`{"role":"user","content":"Review this diff, please."}`}
	var worker string
	for turn := range 4 {
		body := fmt.Sprintf(`{"model":"m","store":false,"instructions":%q,"input":[%s]}`, instructions, strings.Join(input, ","))
		resp, out := p.post(t, "/v1/responses", body, "x-kvroute-explain", "1")
		require.Equal(t, http.StatusOK, resp.StatusCode, out)
		var tr explain.Trace
		require.NoError(t, json.Unmarshal([]byte(resp.Header.Get(explain.ResponseHeader)), &tr))
		assert.Positive(t, tr.Blocks, "turn %d is routed on its prompt", turn)
		if turn > 0 {
			assert.Equal(t, worker, tr.Worker, "turn %d stays with its prefix", turn)
			assert.Positive(t, tr.PredictedCachedTokens, "turn %d", turn)
		}
		worker = tr.Worker
		// The reply comes back as an output message, then the next user turn.
		input = append(input, fmt.Sprintf(`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"answer %d"}]}`, turn),
			fmt.Sprintf(`{"role":"user","content":"And point %d?"}`, turn))
		// Another conversation keeps a worker busy.
		p.post(t, "/v1/chat/completions", chat(fmt.Sprint("other conversation ", turn), false))
	}
	assert.Zero(t, p.storedResponseRequests(t)["stored_worker"], "nothing was stored")
}

// promptRecorder encodes with the file-free pair and keeps each prompt it was given.
type promptRecorder struct {
	mu      *sync.Mutex
	prompts *[]tokenize.Prompt
}

func (r promptRecorder) EncodePrompt(ctx context.Context, p tokenize.Prompt) (tokenize.Encoding, error) {
	r.mu.Lock()
	*r.prompts = append(*r.prompts, p)
	r.mu.Unlock()
	return tokenize.Pipeline{Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}}.EncodePrompt(ctx, p)
}

// TestResponsesPromptsAreEncodedWithSpecialTokens: vLLM tokenizes a Responses
// request's rendered chat with ResponsesRequest.build_tok_params, which leaves
// TokenizeParams.add_special_tokens at its default, true (a chat completion's is the
// request's add_special_tokens, false by default): a tokenizer that adds a BOS (Llama
// 3's, DeepSeek's) adds one before the template's own. The rebuilt prompt must be
// encoded so, or none of its blocks is the engine's.
func TestResponsesPromptsAreEncodedWithSpecialTokens(t *testing.T) {
	var prompts []tokenize.Prompt
	rec := promptRecorder{mu: new(sync.Mutex), prompts: &prompts}
	p := newPlane(t, planeOptions{responses: true, tokenizers: router.OneTokenizer(rec)})
	resp, out := p.post(t, "/v1/responses", `{"model":"m","store":false,"input":"hi"}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, out)
	resp, out = p.post(t, "/v1/chat/completions", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, out)
	p.waitIdle(t)
	require.Len(t, prompts, 2)
	require.NotNil(t, prompts[0].Chat, "the Responses body is routed on its rebuilt chat")
	if assert.NotNil(t, prompts[0].AddSpecialTokens, "a Responses prompt") {
		assert.True(t, *prompts[0].AddSpecialTokens, "a Responses prompt")
	}
	assert.Nil(t, prompts[1].AddSpecialTokens, "a chat completion's: the chat default, none added")
}

// TestResponsesUsageIsCounted: a Responses API response's usage (input_tokens, which
// count every prompt token, and input_tokens_details.cached_tokens) reaches the
// reported-usage counters as a chat completion's does, whole or streamed.
func TestResponsesUsageIsCounted(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			p := newPlane(t, planeOptions{workers: 2, responses: true})
			resp, out := p.post(t, "/v1/responses", fmt.Sprintf(`{"model":"m","input":"hello","stream":%v}`, stream))
			require.Equal(t, http.StatusOK, resp.StatusCode, out)
			p.waitIdle(t)
			assert.Equal(t, 10.0, p.counter(t, "kvroute_filter_reported_prompt_tokens_total", nil))
			assert.Equal(t, 4.0, p.counter(t, "kvroute_filter_reported_cached_tokens_total", nil))
		})
	}
}
