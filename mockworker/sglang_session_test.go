package mockworker

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tokenize"
)

// openSession opens a session with body's fields and returns its id.
func openSession(t *testing.T, url, body string) string {
	t.Helper()
	status, answer := postWithin(t, 10*time.Second, url+"/open_session", body)
	require.Equal(t, http.StatusOK, status, answer)
	var id string
	require.NoError(t, json.Unmarshal([]byte(answer), &id), answer)
	return id
}

// isSGLangValidationError reports an answer in the shape of SGLang's
// RequestValidationError handler.
func isSGLangValidationError(t *testing.T, answer string) {
	t.Helper()
	var e map[string]any
	require.NoError(t, json.Unmarshal([]byte(answer), &e), answer)
	assert.Equal(t, "error", e["object"], answer)
	assert.Equal(t, "Bad Request", e["type"], answer)
	assert.EqualValues(t, 400, e["code"], answer)
}

// /open_session answers the session's id as a bare JSON string: the client's, else a
// new uuid4 hex; an id already open is SGLang's 400, a body that is no
// OpenSessionReqInput a validation error. GET takes a body as POST does.
func TestSGLangOpenSession(t *testing.T) {
	url := generateWorker(t, Config{})
	openSession(t, url, `{"capacity_of_str_len":10,"session_id":"taken"}`)
	uuid := regexp.MustCompile(`^"[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}"$`)
	tests := []struct {
		name, method, body string
		status             int
		answer             string // "" for any
		validation         bool
	}{
		{"no session_id: a new uuid4 hex", http.MethodPost, `{"capacity_of_str_len":100}`, 200, "", false},
		{"the client's id, echoed", http.MethodPost, `{"capacity_of_str_len":100,"session_id":"chosen"}`, 200, `"chosen"`, false},
		{"GET reads a body too", http.MethodGet, `{"capacity_of_str_len":100,"session_id":"by-get"}`, 200, `"by-get"`, false},
		{"streaming and timeout read", http.MethodPost, `{"capacity_of_str_len":1,"session_id":"s","streaming":false,"timeout":1.5}`, 200, `"s"`, false},
		{"session_id null: a new id", http.MethodPost, `{"capacity_of_str_len":1,"session_id":null}`, 200, "", false},
		{"an id open already", http.MethodPost, `{"capacity_of_str_len":10,"session_id":"taken"}`, 400,
			`{"error":{"message":"Failed to open the session. Check if a session with the same id is still open."}}`, false},
		{"no capacity_of_str_len", http.MethodPost, `{"session_id":"x1"}`, 400, "", true},
		{"capacity_of_str_len a string", http.MethodPost, `{"capacity_of_str_len":"10","session_id":"x2"}`, 400, "", true},
		{"capacity_of_str_len a fraction", http.MethodPost, `{"capacity_of_str_len":1.5,"session_id":"x3"}`, 400, "", true},
		{"session_id a number", http.MethodPost, `{"capacity_of_str_len":1,"session_id":7}`, 400, "", true},
		{"not an object", http.MethodPost, `[1]`, 400, "", true},
		{"no body", http.MethodGet, ``, 400, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, answer := callWithin(t, 10*time.Second, tt.method, url+"/open_session", tt.body)
			require.Equal(t, tt.status, status, answer)
			switch {
			case tt.validation:
				isSGLangValidationError(t, answer)
			case tt.answer != "":
				assert.JSONEq(t, tt.answer, answer)
			default:
				assert.Regexp(t, uuid, answer)
			}
		})
	}
}

// /close_session answers 200 with an empty body, whether or not the session was open;
// a closed session's id is unknown to /generate and free to open again.
func TestSGLangCloseSession(t *testing.T) {
	url := generateWorker(t, Config{})
	tests := []struct {
		name, method, body string
		open               bool // open the body's session first
		validation         bool
	}{
		{"an open session", http.MethodPost, `{"session_id":"a"}`, true, false},
		{"by GET", http.MethodGet, `{"session_id":"b"}`, true, false},
		{"an unknown session", http.MethodPost, `{"session_id":"never"}`, false, false},
		{"no session_id", http.MethodPost, `{}`, false, true},
		{"session_id null", http.MethodPost, `{"session_id":null}`, false, true},
		{"not an object", http.MethodPost, `"a"`, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var id string
			if tt.open {
				require.NoError(t, json.Unmarshal([]byte(tt.body), &struct {
					ID *string `json:"session_id"`
				}{&id}))
				openSession(t, url, `{"capacity_of_str_len":10,"session_id":`+strconv.Quote(id)+`}`)
			}
			status, answer := callWithin(t, 10*time.Second, tt.method, url+"/close_session", tt.body)
			if tt.validation {
				require.Equal(t, http.StatusBadRequest, status, answer)
				isSGLangValidationError(t, answer)
				return
			}
			require.Equal(t, http.StatusOK, status, answer)
			assert.Empty(t, answer)
			if !tt.open {
				return
			}
			status, answer = postWithin(t, 10*time.Second, url+sglangGeneratePath, `{"input_ids":[1,2],"session_params":{"id":`+strconv.Quote(id)+`}}`)
			assert.Equal(t, http.StatusBadRequest, status, answer)
			assert.Contains(t, answer, "does not exist")
			assert.Equal(t, id, openSession(t, url, `{"capacity_of_str_len":10,"session_id":`+strconv.Quote(id)+`}`), "open again")
		})
	}
}

// A session's request runs the prompt SGLang's scheduler rebuilds from the session's
// history (the request rid names: its prompt, then its output), followed by the new
// input ids, so a later turn on the same worker hits the cache of the earlier turn's
// prompt and output. Turn 1 is 30 prompt ids and 3 output ids: 33 tokens, 2 full
// blocks of 16; turn 2 adds 5 ids.
func TestSGLangSessionTurnsContinueTheHistory(t *testing.T) {
	newInput := idsPrompt(1000, 5)
	tests := []struct {
		name      string
		streaming bool   // open the session with streaming true
		params    string // turn 2's session_params, %s the session id
		stream    bool   // turn 2 streamed
		prompt    int    // turn 2's prompt_tokens
		cached    int    // turn 2's cached_tokens
	}{
		{"rid: turn 1's prompt and output, then the input", false, `{"id":%q,"rid":"t1"}`, false, 38, 32},
		{"rid, streamed", false, `{"id":%q,"rid":"t1"}`, true, 38, 32},
		{"no rid: an ordinary session starts afresh", false, `{"id":%q}`, false, 5, 0},
		{"a streaming session appends to its last request", true, `{"id":%q}`, false, 38, 32},
		{"drop_previous_output: turn 1's prompt alone", false, `{"id":%q,"rid":"t1","drop_previous_output":true}`, false, 35, 16},
		{"offset: the history's first offset tokens", false, `{"id":%q,"rid":"t1","offset":20}`, false, 25, 16},
		{"offset negative, as Python's slice", false, `{"id":%q,"rid":"t1","offset":-3}`, false, 35, 16},
		{"offset 0: the whole history", false, `{"id":%q,"rid":"t1","offset":0}`, false, 38, 32},
		{"replace continues from rid", false, `{"id":%q,"rid":"t1","replace":true}`, false, 38, 32},
		{"replace without rid: from nothing", false, `{"id":%q,"replace":true}`, false, 5, 0},
		{"session_params null: no session", false, `null`, false, 5, 0},
		{"session_params empty: no session", false, `{}`, false, 5, 0},
		{"session_params.id null: no session", false, `{"id":null,"rid":"t1"}`, false, 5, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := generateWorker(t, Config{})
			id := openSession(t, url, `{"capacity_of_str_len":1000,"streaming":`+strconv.FormatBool(tt.streaming)+`}`)
			tail := `,"sampling_params":{"max_new_tokens":3}`
			first := sglangGenerate(t, url, `{"input_ids":`+idsPrompt(1, 30)+tail+`,"rid":"t1","session_params":{"id":`+strconv.Quote(id)+`}}`, false)
			assert.EqualValues(t, 30, first.MetaInfo["prompt_tokens"], "turn 1: no history")
			assert.EqualValues(t, 0, first.MetaInfo["cached_tokens"])
			params := tt.params
			if strings.Contains(params, "%q") {
				params = fmt.Sprintf(params, id)
			}
			second := sglangGenerate(t, url, `{"input_ids":`+newInput+tail+`,"session_params":`+params+`,"stream":`+strconv.FormatBool(tt.stream)+`}`, tt.stream)
			assert.EqualValues(t, tt.prompt, second.MetaInfo["prompt_tokens"])
			assert.EqualValues(t, tt.cached, second.MetaInfo["cached_tokens"])
		})
	}
}

// Turns chain: turn 3 continuing from turn 2 sees turn 1 and 2 both, and the history
// keeps the output ids the worker answered.
func TestSGLangSessionTurnsChain(t *testing.T) {
	url := generateWorker(t, Config{})
	id := strconv.Quote(openSession(t, url, `{"capacity_of_str_len":1000}`))
	tail := `,"sampling_params":{"max_new_tokens":3}}`
	t1 := sglangGenerate(t, url, `{"input_ids":`+idsPrompt(1, 30)+`,"session_params":{"id":`+id+`}`+tail, false)
	rid1 := t1.MetaInfo["id"].(string)
	t2 := sglangGenerate(t, url, `{"input_ids":[7,8],"session_params":{"id":`+id+`,"rid":"`+rid1+`"}`+tail, false)
	rid2 := t2.MetaInfo["id"].(string)
	assert.EqualValues(t, 35, t2.MetaInfo["prompt_tokens"])
	// Turn 3 from turn 2, cut right after turn 2's output: exactly turn 1 + turn 2's ids.
	want := append(append(append(idsOf(t, idsPrompt(1, 30)), t1.OutputIDs...), 7, 8), t2.OutputIDs...)
	t3 := sglangGenerate(t, url, `{"input_ids":[9],"session_params":{"id":`+id+`,"rid":"`+rid2+`"}`+tail, false)
	assert.EqualValues(t, len(want)+1, t3.MetaInfo["prompt_tokens"])
	assert.EqualValues(t, 32, t3.MetaInfo["cached_tokens"])
	// The same history as plain input ids (no session) hits the same blocks.
	plain, _ := json.Marshal(append(want, 9))
	a := sglangGenerate(t, url, `{"input_ids":`+string(plain)+tail, false)
	assert.EqualValues(t, len(want)+1, a.MetaInfo["prompt_tokens"])
	assert.EqualValues(t, 32, a.MetaInfo["cached_tokens"])
}

func idsOf(t *testing.T, list string) []uint32 {
	t.Helper()
	var ids []uint32
	require.NoError(t, json.Unmarshal([]byte(list), &ids))
	return ids
}

// bosEncoder adds a BOS (999) to a text encoded with special tokens, as a Llama
// tokenizer does.
type bosEncoder struct{ tokenize.PromptEncoder }

func (e bosEncoder) EncodePrompt(ctx context.Context, p tokenize.Prompt) (tokenize.Encoding, error) {
	enc, err := e.PromptEncoder.EncodePrompt(ctx, p)
	if err == nil && p.Chat == nil && (p.AddSpecialTokens == nil || *p.AddSpecialTokens) {
		enc.IDs = append([]uint32{999}, enc.IDs...)
	}
	return enc, err
}

// A text turn is encoded as any SGLang text (special tokens added); appended to a
// history, its leading BOS is dropped, as create_req drops it.
func TestSGLangSessionTextDropsTheBOS(t *testing.T) {
	encoder := bosEncoder{tokenize.Pipeline{Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}}}
	url := generateWorker(t, Config{Tokenizers: router.OneTokenizer(encoder)})
	text := strings.Repeat("the quick brown fox jumps ", 4)
	enc, err := encoder.EncodePrompt(context.Background(), tokenize.Prompt{Text: text})
	require.NoError(t, err)
	require.Equal(t, uint32(999), enc.IDs[0])
	id := strconv.Quote(openSession(t, url, `{"capacity_of_str_len":1000}`))
	tail := `,"sampling_params":{"max_new_tokens":3}}`
	t1 := sglangGenerate(t, url, `{"text":`+strconv.Quote(text)+`,"rid":"t1","session_params":{"id":`+id+`}`+tail, false)
	assert.EqualValues(t, len(enc.IDs), t1.MetaInfo["prompt_tokens"], "turn 1: the text's ids, the BOS first")
	t2 := sglangGenerate(t, url, `{"text":`+strconv.Quote(text)+`,"session_params":{"id":`+id+`,"rid":"t1"}`+tail, false)
	assert.EqualValues(t, len(enc.IDs)+3+len(enc.IDs)-1, t2.MetaInfo["prompt_tokens"], "turn 2: turn 1, then the text without its BOS")
}

// A request SGLang's scheduler aborts with a 400 answers, non-streamed, a 400
// {"error": {"message"}}; streamed, a 200 whose one chunk carries the abort as its
// finish reason, then data: [DONE].
func TestSGLangSessionAbortsBadRequests(t *testing.T) {
	tests := []struct {
		name      string
		streaming bool // the session is a streaming one
		params    string
		input     int // new input ids (MaxModelLen is 50)
		msg       string
	}{
		{"an unknown session", false, `{"id":"nope"}`, 2, "Invalid request: session id nope does not exist"},
		{"an unknown rid", false, `{"id":%q,"rid":"t9"}`, 2, "Invalid request session id"},
		{"replace of an unknown rid", false, `{"id":%q,"rid":"t9","replace":true}`, 2, "Invalid request session id"},
		{"offset in a streaming session", true, `{"id":%q,"offset":3}`, 2, "Streaming sessions do not support offset."},
		{"replace in a streaming session", true, `{"id":%q,"replace":true}`, 2, "Streaming sessions do not support replace."},
		{"drop_previous_output in a streaming session", true, `{"id":%q,"drop_previous_output":true}`, 2, "Streaming sessions do not support drop_previous_output."},
		{"a history past the context", false, `{"id":%q,"rid":"t1"}`, 20, "Input length (53 tokens) exceeds the maximum allowed length"},
	}
	for _, tt := range tests {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, stream %v", tt.name, stream), func(t *testing.T) {
				url := generateWorker(t, Config{MaxModelLen: 50})
				id := openSession(t, url, `{"capacity_of_str_len":1000,"streaming":`+strconv.FormatBool(tt.streaming)+`}`)
				sglangGenerate(t, url, `{"input_ids":`+idsPrompt(1, 30)+`,"rid":"t1","sampling_params":{"max_new_tokens":3},"session_params":{"id":`+strconv.Quote(id)+`}}`, false)
				params := tt.params
				if strings.Contains(params, "%q") {
					params = fmt.Sprintf(params, id)
				}
				body := `{"input_ids":` + idsPrompt(100, tt.input) + `,"rid":"t2","session_params":` + params + `,"stream":` + strconv.FormatBool(stream) + `}`
				status, answer := postWithin(t, 10*time.Second, url+sglangGeneratePath, body)
				if !stream {
					require.Equal(t, http.StatusBadRequest, status, answer)
					var e struct {
						Error struct {
							Message string `json:"message"`
						} `json:"error"`
					}
					require.NoError(t, json.Unmarshal([]byte(answer), &e), answer)
					assert.Contains(t, e.Error.Message, tt.msg)
					if tt.name == "an unknown session" {
						assert.JSONEq(t, `{"error":{"message":"Invalid request: session id nope does not exist"}}`, answer)
					}
					return
				}
				require.Equal(t, http.StatusOK, status, answer)
				chunks := sglangChunks(t, answer)
				require.Len(t, chunks, 1, answer)
				c := chunks[0]
				assert.Empty(t, c.Error)
				assert.Empty(t, c.OutputIDs)
				assert.Equal(t, "t2", c.MetaInfo["id"])
				reason, ok := c.MetaInfo["finish_reason"].(map[string]any)
				require.True(t, ok, answer)
				assert.Equal(t, "abort", reason["type"])
				assert.Contains(t, reason["message"], tt.msg)
				assert.EqualValues(t, 400, reason["status_code"])
				assert.Equal(t, "BadRequestError", reason["err_type"])
			})
		}
	}
}

// session_params must be an object, and SGLang refuses session_id beside it.
func TestSGLangSessionParamsRefusedShapes(t *testing.T) {
	url := generateWorker(t, Config{})
	tests := []struct {
		name, body string
		validation bool
		msg        string
	}{
		{"a list", `{"input_ids":[1],"session_params":[{"id":"a"}]}`, true, "session_params"},
		{"id a number", `{"input_ids":[1],"session_params":{"id":3}}`, true, "session_params"},
		{"beside session_id", `{"input_ids":[1],"session_id":"a","session_params":{"id":"a"}}`, false, "session_id and session_params cannot both be set."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, answer := postWithin(t, 10*time.Second, url+sglangGeneratePath, tt.body)
			require.Equal(t, http.StatusBadRequest, status, answer)
			if tt.validation {
				isSGLangValidationError(t, answer)
			}
			assert.Contains(t, answer, tt.msg)
		})
	}
}

// A worker holds at most sglangMaxSessions sessions, and a session at most
// sglangMaxSessionNodes requests, the oldest forgotten first.
func TestSGLangSessionsAreBounded(t *testing.T) {
	var ss sglangSessions
	for i := range sglangMaxSessions {
		require.True(t, ss.openSession(strconv.Itoa(i), false))
	}
	assert.False(t, ss.openSession("one more", false), "past the bound")
	ss.closeSession("0")
	assert.True(t, ss.openSession("one more", false), "a closed session frees its place")

	id := "1"
	for i := range sglangMaxSessionNodes + 1 {
		rid := "r" + strconv.Itoa(i)
		p := &sglangSessionParams{ID: &id}
		if i > 0 {
			prev := "r" + strconv.Itoa(i-1)
			p.RID = &prev
		}
		turn, _, abort := ss.begin(p, rid, []uint32{uint32(i)}, 0, false)
		require.Empty(t, abort)
		ss.end(turn, []uint32{7}, true)
	}
	assert.Len(t, ss.open[id].nodes, sglangMaxSessionNodes)
	first, last := "r0", "r"+strconv.Itoa(sglangMaxSessionNodes)
	_, _, abort := ss.begin(&sglangSessionParams{ID: &id, RID: &first}, "x", []uint32{1}, 0, false)
	assert.Equal(t, "Invalid request session id", abort, "the oldest is forgotten")
	_, prompt, abort := ss.begin(&sglangSessionParams{ID: &id, RID: &last}, "y", []uint32{1}, 0, false)
	assert.Empty(t, abort)
	assert.Len(t, prompt, 2*(sglangMaxSessionNodes+1)+1, "every turn's input and output, then the new input")
}
