package fakeworker

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// call sends one request to w over HTTP and returns its status and body.
func call(t *testing.T, w *Worker, method, path, body string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+w.Address+path, strings.NewReader(body))
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("content-type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, b
}

// field is the value at a dotted path of a JSON object ("output.0.id").
func field(t *testing.T, body []byte, path string) any {
	t.Helper()
	var v any
	require.NoError(t, json.Unmarshal(body, &v), "%s", body)
	for _, k := range strings.Split(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			v = x[k]
		case []any:
			var i int
			_, err := fmt.Sscan(k, &i)
			require.NoError(t, err)
			require.Less(t, i, len(x), "%s in %s", path, body)
			v = x[i]
		default:
			t.Fatalf("%s: no %q in %s", path, k, body)
		}
	}
	return v
}

func notFound(id string) string {
	return `{"error":{"message":"Response with id '` + id + `' not found.","type":"invalid_request_error","param":"response_id","code":404}}`
}

func TestFakeResponses(t *testing.T) {
	type step struct {
		method, path, body string
		status             int
		want               map[string]any // dotted path → value
		wantBody           string         // JSON the body equals, when set
	}
	post := func(body string, status int, want map[string]any) step {
		return step{method: "POST", path: "/v1/responses", body: body, status: status, want: want}
	}
	created := func(id string) map[string]any {
		return map[string]any{
			"id": id, "object": "response", "status": "completed", "model": "qwen",
			"output.0.id": "msg_" + strings.TrimPrefix(id, "resp_"), "output.0.type": "message",
			"output.0.role": "assistant", "output.0.content.0.type": "output_text",
			"output.0.content.0.text": "hello from w0", "usage.input_tokens": 10.0,
			"usage.output_tokens": 3.0, "usage.total_tokens": 13.0, "previous_response_id": nil,
		}
	}
	for _, tc := range []struct {
		name       string
		steps      []step
		wantStored []string
	}{{
		name:       "create",
		steps:      []step{post(`{"model":"qwen","input":"hi"}`, 200, created("resp_w0_1"))},
		wantStored: []string{"resp_w0_1"},
	}, {
		name: "continue",
		steps: []step{
			post(`{"model":"qwen","input":"hi"}`, 200, created("resp_w0_1")),
			post(`{"model":"qwen","input":[{"role":"user","content":"and?"}],"previous_response_id":"resp_w0_1"}`, 200,
				map[string]any{"id": "resp_w0_2", "status": "completed", "previous_response_id": "resp_w0_1"}),
		},
		wantStored: []string{"resp_w0_1", "resp_w0_2"},
	}, {
		name: "unknown previous id",
		steps: []step{{method: "POST", path: "/v1/responses", body: `{"model":"qwen","input":"hi","previous_response_id":"resp_w1_1"}`,
			status: 404, wantBody: notFound("resp_w1_1")}},
	}, {
		name: "store false",
		steps: []step{
			post(`{"model":"qwen","input":"hi","store":false}`, 200, created("resp_w0_1")),
			{method: "GET", path: "/v1/responses/resp_w0_1", status: 404, wantBody: notFound("resp_w0_1")},
			post(`{"model":"qwen","input":"hi","previous_response_id":"resp_w0_1"}`, 404, nil),
		},
	}, {
		name: "get known",
		steps: []step{
			post(`{"model":"qwen","input":"hi"}`, 200, nil),
			{method: "GET", path: "/v1/responses/resp_w0_1", status: 200, want: created("resp_w0_1")},
		},
		wantStored: []string{"resp_w0_1"},
	}, {
		name:  "get unknown",
		steps: []step{{method: "GET", path: "/v1/responses/resp_w0_7", status: 404, wantBody: notFound("resp_w0_7")}},
	}, {
		name:  "cancel unknown",
		steps: []step{{method: "POST", path: "/v1/responses/resp_w0_7/cancel", status: 404, wantBody: notFound("resp_w0_7")}},
	}, {
		name: "cancel finished",
		steps: []step{
			post(`{"model":"qwen","input":"hi"}`, 200, nil),
			{method: "POST", path: "/v1/responses/resp_w0_1/cancel", status: 400,
				wantBody: `{"error":{"message":"Cannot cancel a synchronous response.","type":"invalid_request_error","param":"response_id","code":400}}`},
			{method: "GET", path: "/v1/responses/resp_w0_1", status: 200, want: map[string]any{"status": "completed"}},
		},
		wantStored: []string{"resp_w0_1"},
	}, {
		name: "cancel background",
		steps: []step{
			post(`{"model":"qwen","input":"HANG_BEFORE_FIRST_TOKEN","background":true}`, 200,
				map[string]any{"id": "resp_w0_1", "status": "queued", "background": true, "usage": nil}),
			{method: "GET", path: "/v1/responses/resp_w0_1", status: 200, want: map[string]any{"status": "queued"}},
			{method: "POST", path: "/v1/responses/resp_w0_1/cancel", status: 200, want: map[string]any{"id": "resp_w0_1", "status": "cancelled"}},
			{method: "GET", path: "/v1/responses/resp_w0_1", status: 200, want: map[string]any{"status": "cancelled"}},
			{method: "POST", path: "/v1/responses/resp_w0_1/cancel", status: 400, want: map[string]any{"error.code": 400.0}},
		},
		wantStored: []string{"resp_w0_1"},
	}, {
		name: "background completes",
		steps: []step{
			post(`{"model":"qwen","input":"hi","background":true}`, 200, map[string]any{"id": "resp_w0_1", "status": "queued"}),
			{method: "GET", path: "/v1/responses/resp_w0_1", status: 200, want: created("resp_w0_1")},
		},
		wantStored: []string{"resp_w0_1"},
	}, {
		name: "background without store",
		steps: []step{post(`{"model":"qwen","input":"hi","background":true,"store":false}`, 400,
			map[string]any{"error.code": 400.0, "error.message": "background can only be used when `store` is true"})},
	}, {
		name:  "failing engine",
		steps: []step{post(`{"model":"qwen","input":"FAIL_UPSTREAM"}`, 503, map[string]any{"error.type": "server_error"})},
	}, {
		name:  "no input",
		steps: []step{post(`{"model":"qwen"}`, 400, map[string]any{"error.code": 400.0})},
	}, {
		name: "echo model",
		steps: []step{post(`{"model":"qwen","input":"ECHO_MODEL"}`, 200,
			map[string]any{"output.0.content.0.text": `{"model":"qwen"} `})},
		wantStored: []string{"resp_w0_1"},
	}, {
		name: "methods and paths",
		steps: []step{
			{method: "GET", path: "/v1/responses", status: 405},
			{method: "DELETE", path: "/v1/responses/resp_w0_1", status: 405},
			{method: "GET", path: "/v1/responses/resp_w0_1/input_items", status: 404, wantBody: `{"detail":"Not Found"}`},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			w := New("w0")
			defer w.Close()
			for i, s := range tc.steps {
				status, header, body := call(t, w, s.method, s.path, s.body)
				require.Equal(t, s.status, status, "step %d: %s", i, body)
				assert.Equal(t, "w0", header.Get("x-served-by"))
				if s.wantBody != "" {
					assert.JSONEq(t, s.wantBody, string(body), "step %d", i)
				}
				for path, want := range s.want {
					assert.Equal(t, want, field(t, body, path), "step %d: %s in %s", i, path, body)
				}
			}
			assert.Equal(t, tc.wantStored, nilIfEmpty(w.StoredResponses()))
			served := w.Served()
			require.Len(t, served, len(tc.steps))
			for i, s := range tc.steps {
				assert.Equal(t, s.path, served[i].Path)
				assert.Equal(t, s.body, string(served[i].Body))
			}
		})
	}
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

// The store is per worker: another worker answers 404.
func TestFakeResponsesPerWorker(t *testing.T) {
	w0, w1 := New("w0"), New("w1")
	defer w0.Close()
	defer w1.Close()
	status, _, body := call(t, w0, "POST", "/v1/responses", `{"model":"qwen","input":"hi"}`)
	require.Equal(t, 200, status, "%s", body)
	status, _, body = call(t, w1, "POST", "/v1/responses", `{"model":"qwen","input":"hi","previous_response_id":"resp_w0_1"}`)
	assert.Equal(t, 404, status)
	assert.JSONEq(t, notFound("resp_w0_1"), string(body))
	status, _, _ = call(t, w1, "GET", "/v1/responses/resp_w0_1", "")
	assert.Equal(t, 404, status)
	status, _, _ = call(t, w1, "POST", "/v1/responses/resp_w0_1/cancel", "")
	assert.Equal(t, 404, status)
	status, _, body = call(t, w1, "POST", "/v1/responses", `{"model":"qwen","input":"hi"}`)
	require.Equal(t, 200, status)
	assert.Equal(t, "resp_w1_1", field(t, body, "id"))
	assert.Equal(t, []string{"resp_w0_1"}, w0.StoredResponses())
	assert.Equal(t, []string{"resp_w1_1"}, w1.StoredResponses())
}

// A killed and restarted worker has lost its store, and hands out new ids.
func TestFakeResponsesKillRestart(t *testing.T) {
	for _, stop := range []string{"Kill", "Close"} {
		t.Run(stop, func(t *testing.T) {
			w := New("w0")
			defer w.Close()
			status, _, _ := call(t, w, "POST", "/v1/responses", `{"model":"qwen","input":"hi"}`)
			require.Equal(t, 200, status)
			if stop == "Kill" {
				w.Kill()
				assert.Empty(t, w.StoredResponses())
			} else {
				w.Close()
				assert.Equal(t, []string{"resp_w0_1"}, w.StoredResponses(), "Close keeps the store")
			}
			require.NoError(t, w.Restart())
			assert.Empty(t, w.StoredResponses())
			status, _, body := call(t, w, "GET", "/v1/responses/resp_w0_1", "")
			assert.Equal(t, 404, status)
			assert.JSONEq(t, notFound("resp_w0_1"), string(body))
			status, _, _ = call(t, w, "POST", "/v1/responses", `{"model":"qwen","input":"hi","previous_response_id":"resp_w0_1"}`)
			assert.Equal(t, 404, status)
			status, _, body = call(t, w, "POST", "/v1/responses", `{"model":"qwen","input":"hi"}`)
			require.Equal(t, 200, status)
			assert.Equal(t, "resp_w0_2", field(t, body, "id"), "ids are not reused")
			assert.Equal(t, []string{"resp_w0_2"}, w.StoredResponses())
		})
	}
}

type sseEvent struct {
	name string
	data []byte
}

// readEvent reads one event of an SSE stream.
func readEvent(r *bufio.Reader) (sseEvent, error) {
	var ev sseEvent
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return ev, err
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "":
			return ev, nil
		case strings.HasPrefix(line, "event: "):
			ev.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.data = []byte(strings.TrimPrefix(line, "data: "))
		}
	}
}

func TestFakeResponsesStream(t *testing.T) {
	w := New("w0")
	defer w.Close()
	resp, err := http.Post("http://"+w.Address+"/v1/responses", "application/json",
		strings.NewReader(`{"model":"qwen","input":"hi","stream":true}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "text/event-stream; charset=utf-8", resp.Header.Get("content-type"))
	r := bufio.NewReader(resp.Body)
	var events []sseEvent
	for {
		ev, err := readEvent(r)
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		events = append(events, ev)
	}
	var names []string
	var text string
	for i, ev := range events {
		names = append(names, ev.name)
		assert.Equal(t, ev.name, field(t, ev.data, "type"))
		assert.Equal(t, float64(i), field(t, ev.data, "sequence_number"))
		if ev.name == "response.output_text.delta" {
			text += field(t, ev.data, "delta").(string)
			assert.Equal(t, "msg_w0_1", field(t, ev.data, "item_id"))
		}
	}
	assert.Equal(t, []string{
		"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed",
	}, names)
	assert.Equal(t, "t0 t1 t2 ", text)
	first, last := events[0].data, events[len(events)-1].data
	assert.Equal(t, "resp_w0_1", field(t, first, "response.id"))
	assert.Equal(t, "in_progress", field(t, first, "response.status"))
	assert.Equal(t, []any{}, field(t, first, "response.output"))
	assert.Equal(t, "resp_w0_1", field(t, last, "response.id"))
	assert.Equal(t, "completed", field(t, last, "response.status"))
	assert.Equal(t, "t0 t1 t2 ", field(t, last, "response.output.0.content.0.text"))
	assert.Equal(t, []string{"resp_w0_1"}, w.StoredResponses())

	// The stored response is the completed one.
	status, _, body := call(t, w, "GET", "/v1/responses/resp_w0_1", "")
	require.Equal(t, 200, status)
	var stored, completed any
	require.NoError(t, json.Unmarshal(body, &stored))
	require.NoError(t, json.Unmarshal(last, &completed))
	assert.Equal(t, completed.(map[string]any)["response"], stored)
}

// A stream that hangs sends its first events at once; cut off, it stores nothing.
func TestFakeResponsesStreamHang(t *testing.T) {
	w := New("w0")
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", "http://"+w.Address+"/v1/responses",
		strings.NewReader(`{"model":"qwen","input":"HANG_AFTER_FIRST_TOKEN","stream":true}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	ev, err := readEvent(r)
	require.NoError(t, err)
	assert.Equal(t, "response.created", ev.name)
	assert.Equal(t, "resp_w0_1", field(t, ev.data, "response.id"))
	for _, name := range []string{"response.in_progress", "response.output_item.added", "response.content_part.added", "response.output_text.delta"} {
		ev, err = readEvent(r)
		require.NoError(t, err)
		assert.Equal(t, name, ev.name)
	}
	cancel()
	_, err = readEvent(r)
	require.Error(t, err)
	assert.Empty(t, w.StoredResponses())
}

// A response cut in two by SplitResponses is still the whole response.
func TestFakeResponsesSplit(t *testing.T) {
	w := New("w0")
	defer w.Close()
	w.SplitResponses(func(b []byte) int { return len(b) / 2 }, func(int) {})
	for _, stream := range []bool{false, true} {
		status, _, body := call(t, w, "POST", "/v1/responses", fmt.Sprintf(`{"model":"qwen","input":"hi","stream":%t}`, stream))
		require.Equal(t, 200, status)
		if stream {
			assert.Contains(t, string(body), "event: response.completed\n")
		} else {
			assert.Equal(t, "completed", field(t, body, "status"))
		}
	}
	assert.Equal(t, []string{"resp_w0_1", "resp_w0_2"}, w.StoredResponses())
}

// OpenAI's own client reads what the worker answers.
func TestFakeResponsesOpenAIClient(t *testing.T) {
	w := New("w0")
	defer w.Close()
	client := openai.NewClient(option.WithBaseURL("http://"+w.Address+"/v1/"), option.WithAPIKey("test"), option.WithMaxRetries(0))
	ctx := context.Background()
	first, err := client.Responses.New(ctx, responses.ResponseNewParams{
		Model: "qwen", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")},
	})
	require.NoError(t, err)
	assert.Equal(t, "resp_w0_1", first.ID)
	assert.Equal(t, "hello from w0", first.OutputText())
	assert.Equal(t, int64(13), first.Usage.TotalTokens)

	stream := client.Responses.NewStreaming(ctx, responses.ResponseNewParams{
		Model: "qwen", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("and?")},
		PreviousResponseID: openai.String(first.ID),
	})
	var types []string
	var done responses.Response
	for stream.Next() {
		ev := stream.Current()
		types = append(types, ev.Type)
		if ev.Type == "response.completed" {
			done = ev.AsResponseCompleted().Response
		}
	}
	require.NoError(t, stream.Err())
	require.NotEmpty(t, types)
	assert.Equal(t, "response.created", types[0])
	assert.Equal(t, "resp_w0_2", done.ID)
	assert.Equal(t, "resp_w0_1", done.PreviousResponseID)
	assert.Equal(t, "t0 t1 t2 ", done.OutputText())

	got, err := client.Responses.Get(ctx, "resp_w0_2", responses.ResponseGetParams{})
	require.NoError(t, err)
	assert.Equal(t, responses.ResponseStatusCompleted, got.Status)

	_, err = client.Responses.Get(ctx, "resp_w0_9", responses.ResponseGetParams{})
	var apiErr *openai.Error
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, 404, apiErr.StatusCode)
	assert.Equal(t, "Response with id 'resp_w0_9' not found.", apiErr.Message)
}
