package mockworker

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/tokenize"
)

// sglangAnswer is what a test reads of SGLang's out dict, whole or one streamed chunk.
type sglangAnswer struct {
	Text      string          `json:"text"`
	OutputIDs []uint32        `json:"output_ids"`
	MetaInfo  map[string]any  `json:"meta_info"`
	Error     json.RawMessage `json:"error"`
}

// sseData reads a stream's data events before data: [DONE], which ends it.
func sseData(t *testing.T, body string) []string {
	t.Helper()
	require.True(t, strings.HasSuffix(body, "data: [DONE]\n\n"), body)
	var events []string
	for _, line := range strings.Split(strings.TrimSuffix(body, "data: [DONE]\n\n"), "\n") {
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		require.True(t, ok, line)
		events = append(events, data)
	}
	return events
}

// sglangChunks reads a /generate stream: its data events before data: [DONE].
func sglangChunks(t *testing.T, body string) []sglangAnswer {
	t.Helper()
	var chunks []sglangAnswer
	for _, data := range sseData(t, body) {
		var c sglangAnswer
		require.NoError(t, json.Unmarshal([]byte(data), &c), data)
		chunks = append(chunks, c)
	}
	return chunks
}

// sglangGenerate posts body to /generate and returns its answer, the last chunk's of a
// stream.
func sglangGenerate(t *testing.T, url, body string, stream bool) sglangAnswer {
	t.Helper()
	status, answer := postWithin(t, 10*time.Second, url+sglangGeneratePath, body)
	require.Equal(t, http.StatusOK, status, answer)
	if stream {
		chunks := sglangChunks(t, answer)
		require.NotEmpty(t, chunks)
		return chunks[len(chunks)-1]
	}
	var a sglangAnswer
	require.NoError(t, json.Unmarshal([]byte(answer), &a), answer)
	return a
}

// A /generate prompt runs through the engine as any prompt does: a second identical
// prompt finds its full blocks cached (meta_info.cached_tokens), whole or streamed, and
// a text and the input_ids it tokenizes to (special tokens added, as SGLang's
// tokenizer.encode does) hit the same blocks, as does a completion of that text.
func TestSGLangGenerateHitsThePrefixCache(t *testing.T) {
	text := strings.Repeat("the quick brown fox jumps ", 8)
	enc, err := tokenize.Pipeline{Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}}.EncodePrompt(context.Background(), tokenize.Prompt{Text: text})
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(enc.IDs), 32)
	full := len(enc.IDs) / 16 * 16
	ids, _ := json.Marshal(enc.IDs)
	textBody, idsBody := `"text":`+strconv.Quote(text), `"input_ids":`+string(ids)
	tests := []struct {
		name          string
		first, second string
		stream        bool
	}{
		{"text twice", textBody, textBody, false},
		{"text twice, streamed", textBody, textBody, true},
		{"input_ids twice", idsBody, idsBody, false},
		{"text then its input_ids", textBody, idsBody, false},
		{"input_ids then their text, streamed", idsBody, textBody, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := generateWorker(t, Config{})
			tail := `,"sampling_params":{"max_new_tokens":3,"temperature":0},"stream":` + strconv.FormatBool(tt.stream) + `}`
			for turn, c := range []struct {
				body   string
				cached int
			}{{tt.first, 0}, {tt.second, full}} {
				a := sglangGenerate(t, url, "{"+c.body+tail, tt.stream)
				assert.EqualValues(t, len(enc.IDs), a.MetaInfo["prompt_tokens"], "turn %d", turn)
				assert.EqualValues(t, 3, a.MetaInfo["completion_tokens"], "turn %d", turn)
				assert.EqualValues(t, c.cached, a.MetaInfo["cached_tokens"], "turn %d: the full blocks of the prompt", turn)
			}
			status, answer := postWithin(t, 10*time.Second, url+"/v1/completions", `{"model":"mock","prompt":`+strconv.Quote(text)+`,"max_tokens":1}`)
			require.Equal(t, http.StatusOK, status, answer)
			var u completionUsage
			require.NoError(t, json.Unmarshal([]byte(answer), &u))
			assert.Equal(t, full, u.cached(t), "a completion of the same text shares the blocks")
		})
	}
}

// The whole answer is SGLang's out dict: text, output_ids and meta_info with the keys
// _handle_batch_output writes (the finish reason an object); a stream (without
// --incremental-streaming-output) sends the text and output ids so far in every chunk,
// a finish reason in the last alone, then data: [DONE]. rid is meta_info.id.
func TestSGLangGenerateAnswersInSGLangsShapes(t *testing.T) {
	url := generateWorker(t, Config{TokensPerEvent: 2})
	body := `{"input_ids":` + idsPrompt(1, 20) + `,"sampling_params":{"max_new_tokens":5},"rid":"r-1"`

	whole := sglangGenerate(t, url, body+`}`, false)
	keys := make([]string, 0, len(whole.MetaInfo))
	for k := range whole.MetaInfo {
		keys = append(keys, k)
	}
	assert.ElementsMatch(t, []string{"id", "finish_reason", "prompt_tokens", "weight_version", "num_retractions", "reasoning_tokens",
		"completion_tokens", "cached_tokens", "e2e_latency", "response_sent_to_client_ts"}, keys)
	assert.Equal(t, "r-1", whole.MetaInfo["id"])
	assert.Equal(t, map[string]any{"type": "length", "length": 5.0}, whole.MetaInfo["finish_reason"])
	assert.Len(t, whole.OutputIDs, 5)
	assert.Len(t, strings.Fields(whole.Text), 5, "one word a token")

	status, answer := postWithin(t, 10*time.Second, url+sglangGeneratePath, body+`,"stream":true}`)
	require.Equal(t, http.StatusOK, status, answer)
	chunks := sglangChunks(t, answer)
	require.Len(t, chunks, 3, "the first token, then two a chunk")
	for i, c := range chunks {
		last := i == len(chunks)-1
		assert.Equal(t, "r-1", c.MetaInfo["id"])
		assert.Equal(t, []int{1, 3, 5}[i], len(c.OutputIDs), "chunk %d: the output ids so far", i)
		assert.Len(t, strings.Fields(c.Text), len(c.OutputIDs), "chunk %d: the text so far", i)
		assert.EqualValues(t, len(c.OutputIDs), c.MetaInfo["completion_tokens"])
		assert.Equal(t, last, c.MetaInfo["finish_reason"] != nil, "chunk %d", i)
		_, latency := c.MetaInfo["e2e_latency"]
		assert.Equal(t, last, latency, "chunk %d", i)
		_, sent := c.MetaInfo["response_sent_to_client_ts"]
		assert.Equal(t, i == 0, sent, "chunk %d", i)
		if i > 0 {
			assert.Equal(t, chunks[i-1].OutputIDs, c.OutputIDs[:len(chunks[i-1].OutputIDs)])
			assert.True(t, strings.HasPrefix(c.Text, chunks[i-1].Text))
		}
	}

	// Without max_new_tokens: SamplingParams' 128.
	a := sglangGenerate(t, url, `{"input_ids":[1,2,3]}`, false)
	assert.Len(t, a.OutputIDs, 128)
	assert.Len(t, a.MetaInfo["id"], 32, "a uuid4's hex")
}

// Bodies SGLang refuses: FastAPI's validation errors (400, ErrorResponse), the
// ValueErrors of normalize/tokenize/validate (400 {"error": {"message"}}, or in a stream
// a data: {"error"} event after a 200), and what the worker does not serve (batches,
// parallel samples, multimodal input, max_new_tokens 0), refused as a ValueError.
func TestSGLangGenerateRefusesBadBodies(t *testing.T) {
	url := generateWorker(t, Config{MaxModelLen: 100, ServedModels: []string{"qwen"}, LoRAAdapters: map[string]string{"sql": "qwen"}})
	tests := []struct {
		name, body string
		validation bool   // FastAPI's 400, not a ValueError's
		msg        string // in the error's message; "" for a 200
	}{
		{"not an object", `[1,2,3]`, true, "GenerateReqInput"},
		{"stream a string", `{"input_ids":[1],"stream":"yes"}`, true, "stream"},
		{"no prompt", `{"sampling_params":{}}`, false, "Either text, input_ids or input_embeds should be provided."},
		{"input_ids empty", `{"input_ids":[]}`, false, "input_ids cannot be empty."},
		{"text empty", `{"text":""}`, false, "texts cannot be empty"},
		{"input_embeds", `{"input_embeds":[[0.5]]}`, false, "disable_radix_cache"},
		{"a batch of texts", `{"text":["a","b"]}`, false, "one prompt a request"},
		{"a batch of id lists", `{"input_ids":[[1],[2]]}`, false, "one prompt a request"},
		{"parallel samples", `{"input_ids":[1,2],"sampling_params":{"n":2}}`, false, "one sequence a request"},
		{"max_new_tokens negative", `{"input_ids":[1,2],"sampling_params":{"max_new_tokens":-1}}`, false, "max_new_tokens must be at least 0, got -1."},
		{"max_new_tokens 0", `{"input_ids":[1,2],"sampling_params":{"max_new_tokens":0}}`, false, "cannot prefill only"},
		{"an image", `{"text":"hi","image_data":"http://x/cat.png"}`, false, "multimodal"},
		{"an unknown adapter", `{"input_ids":[1,2],"lora_path":"chat"}`, false, "Got LoRA adapter that has never been loaded: chat"},
		{"past the context", `{"input_ids":` + idsPrompt(1, 100) + `}`, false, "The input (100 tokens) is longer than the model's context length (100 tokens)."},
		{"a bound past the context", `{"input_ids":` + idsPrompt(1, 90) + `,"sampling_params":{"max_new_tokens":20}}`, false, "You requested a total of 110 tokens"},
		{"an adapter", `{"input_ids":[1,2],"lora_path":"sql","sampling_params":{"max_new_tokens":1}}`, false, ""},
		{"input_ids win over text", `{"text":"hello there","input_ids":[1,2,3],"sampling_params":{"max_new_tokens":1}}`, false, ""},
		{"max_new_tokens null: the context", `{"input_ids":` + idsPrompt(1, 90) + `,"sampling_params":{"max_new_tokens":null}}`, false, ""},
		{"no max_new_tokens: 128 trimmed to the context, unchecked", `{"input_ids":` + idsPrompt(1, 90) + `}`, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, answer := postWithin(t, 10*time.Second, url+sglangGeneratePath, tt.body)
			if tt.msg == "" {
				require.Equal(t, http.StatusOK, status, answer)
				var a sglangAnswer
				require.NoError(t, json.Unmarshal([]byte(answer), &a))
				assert.NotEmpty(t, a.OutputIDs)
				if strings.Contains(tt.name, "input_ids win") {
					assert.EqualValues(t, 3, a.MetaInfo["prompt_tokens"])
				}
				if strings.Contains(tt.name, "null") || strings.Contains(tt.name, "trimmed") {
					assert.Len(t, a.OutputIDs, 10, "what the context leaves")
				}
				return
			}
			require.Equal(t, http.StatusBadRequest, status, answer)
			if tt.validation {
				var e struct {
					Object, Message, Type string
					Code                  int
				}
				require.NoError(t, json.Unmarshal([]byte(answer), &e), answer)
				assert.Equal(t, "error", e.Object)
				assert.Equal(t, "Bad Request", e.Type)
				assert.Equal(t, 400, e.Code)
				assert.Contains(t, e.Message, tt.msg)
				return
			}
			var e struct{ Error struct{ Message string } }
			require.NoError(t, json.Unmarshal([]byte(answer), &e), answer)
			assert.Contains(t, e.Error.Message, tt.msg)

			// Streamed, the same ValueError is an event after a 200.
			if !strings.HasPrefix(tt.body, "{") {
				return
			}
			status, answer = postWithin(t, 10*time.Second, url+sglangGeneratePath, strings.TrimSuffix(tt.body, "}")+`,"stream":true}`)
			require.Equal(t, http.StatusOK, status, answer)
			chunks := sglangChunks(t, answer)
			require.Len(t, chunks, 1, answer)
			assert.Contains(t, string(chunks[0].Error), tt.msg[:min(len(tt.msg), 20)])
		})
	}
}

// An adapter never loaded is refused with the loaded adapters listed, the same list
// every time (SGLang lists them in its dict's order; the worker's map has none, so it
// sorts them).
func TestSGLangGenerateListsTheLoadedAdaptersInOneOrder(t *testing.T) {
	adapters := map[string]string{}
	for _, name := range []string{"e", "c", "a", "d", "b", "f", "h", "g"} {
		adapters[name] = "qwen"
	}
	url := generateWorker(t, Config{ServedModels: []string{"qwen"}, LoRAAdapters: adapters})
	for range 5 {
		status, answer := postWithin(t, 10*time.Second, url+sglangGeneratePath, `{"input_ids":[1,2],"lora_path":"chat"}`)
		require.Equal(t, http.StatusBadRequest, status, answer)
		var e struct{ Error struct{ Message string } }
		require.NoError(t, json.Unmarshal([]byte(answer), &e), answer)
		assert.Equal(t, "Got LoRA adapter that has never been loaded: chat\nAll loaded adapters: dict_keys(['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h']).", e.Error.Message)
	}
}
