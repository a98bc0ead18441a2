package engine

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/tokenize"
)

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

// renderServer answers the render endpoints with handler and records what it got.
func renderServer(t *testing.T, handler http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	return srv
}

func newClient(t *testing.T, url string, timeout time.Duration, reg prometheus.Registerer) *Client {
	t.Helper()
	c, err := New(Config{URL: url, Timeout: timeout, MaxConcurrency: 1}, "m", 1000, nil, NewMetrics(reg))
	require.NoError(t, err)
	return c
}

func TestClientSendsTheBodyAndReadsTheIDs(t *testing.T) {
	var gotPath, gotBody, gotType string
	srv := renderServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotPath, gotBody, gotType = r.URL.Path, string(b), r.Header.Get("content-type")
		if r.URL.Path == CompletionsPath {
			_, _ = io.WriteString(w, `[{"token_ids":[5,6]}]`)
			return
		}
		_, _ = io.WriteString(w, vllmChatReply)
	})
	reg := prometheus.NewRegistry()
	c := newClient(t, srv.URL+"/", time.Minute, reg)

	enc, err := c.EncodePrompt(context.Background(), tokenize.Prompt{Chat: tokenize.TextChat("user", "hi"), Body: []byte(chatBody)})
	require.NoError(t, err)
	assert.Equal(t, "", enc.Text, "the endpoint returns no prompt text")
	assert.Equal(t, []uint32{151644, 8948, 198, 2610}, enc.IDs)
	assert.Equal(t, ChatPath, gotPath)
	assert.Equal(t, chatBody, gotBody, "the client's body is sent as is")
	assert.Equal(t, "application/json", gotType)

	enc, err = c.EncodePrompt(context.Background(), tokenize.Prompt{Text: "hi", Body: []byte(`{"model":"m","prompt":"hi"}`)})
	require.NoError(t, err)
	assert.Equal(t, []uint32{5, 6}, enc.IDs)
	assert.Equal(t, CompletionsPath, gotPath)
	assert.Equal(t, 2.0, testutil.ToFloat64(c.metrics.renders.WithLabelValues("m", OutcomeOK)))
}

func TestClientFailuresWrapErrEngine(t *testing.T) {
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	closed := renderServer(t, func(http.ResponseWriter, *http.Request) {})
	closedURL := closed.URL
	closed.Close()
	tests := []struct {
		name    string
		handler http.HandlerFunc // nil: the closed server
		timeout time.Duration
		outcome string
		detail  string
	}{
		{"server down", nil, time.Minute, OutcomeUnreachable, "unreachable"},
		{"server never answers", func(_ http.ResponseWriter, r *http.Request) {
			// The server notices the client hang up (and cancels r's context) only
			// once the body is read.
			_, _ = io.Copy(io.Discard, r.Body)
			select {
			case <-block:
			case <-r.Context().Done():
			}
		}, 20 * time.Millisecond, OutcomeTimeout, "timeout"},
		{"vLLM refuses the request", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"the secret prompt","type":"BadRequestError","param":null,"code":400}}`)
		}, time.Minute, OutcomeStatus, "status 400"},
		{"a malformed reply", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, `{"token_ids":[1,`)
		}, time.Minute, OutcomeBadReply, "bad_reply"},
		{"an id out of range", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, `{"token_ids":[3000000000]}`)
		}, time.Minute, OutcomeBadReply, "above 2^31-1"},
		{"a reply over the size bound", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, `{"x":"`+strings.Repeat("a", 1000*replyBytesPerToken+replyOverheadBytes)+`","token_ids":[1]}`)
		}, time.Minute, OutcomeBadReply, "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := closedURL
			if tt.handler != nil {
				url = renderServer(t, tt.handler).URL
			}
			reg := prometheus.NewRegistry()
			c := newClient(t, url, tt.timeout, reg)
			enc, err := c.EncodePrompt(context.Background(), tokenize.Prompt{Chat: tokenize.TextChat("user", "hi"), Body: []byte(chatBody)})
			ids := enc.IDs
			require.ErrorIs(t, err, tokenize.ErrEngine)
			assert.Contains(t, err.Error(), tt.detail)
			assert.NotContains(t, err.Error(), "secret", "an error reply may quote the prompt: it stays out of errors")
			assert.Nil(t, ids)
			assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.renders.WithLabelValues("m", tt.outcome)))
		})
	}
}

func TestClientBoundsRendersInFlight(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	srv := renderServer(t, func(w http.ResponseWriter, _ *http.Request) {
		entered <- struct{}{}
		<-release
		_, _ = io.WriteString(w, `{"token_ids":[1]}`)
	})
	c := newClient(t, srv.URL, time.Minute, nil) // one slot
	prompt := tokenize.Prompt{Chat: tokenize.TextChat("user", "hi"), Body: []byte(chatBody)}
	first := make(chan error, 1)
	go func() {
		_, err := c.EncodePrompt(context.Background(), prompt)
		first <- err
	}()
	<-entered
	_, err := c.EncodePrompt(context.Background(), prompt)
	require.ErrorIs(t, err, tokenize.ErrEngine)
	assert.Contains(t, err.Error(), OutcomeBusy, "the second render is not queued behind the first")
	close(release)
	require.NoError(t, <-first)
	go func() { <-entered }() // the third render's handler
	enc, err := c.EncodePrompt(context.Background(), prompt)
	require.NoError(t, err)
	assert.Equal(t, []uint32{1}, enc.IDs, "the slot is free again")
}

func TestClientCanceledByTheRequest(t *testing.T) {
	srv := renderServer(t, func(_ http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body); <-r.Context().Done() })
	c := newClient(t, srv.URL, time.Minute, prometheus.NewRegistry())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.EncodePrompt(ctx, tokenize.Prompt{Text: "x", Body: []byte(`{}`)})
	require.ErrorIs(t, err, tokenize.ErrEngine)
	assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.renders.WithLabelValues("m", OutcomeCanceled)))
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"defaults filled", Config{URL: "http://127.0.0.1:8000"}, ""},
		{"with a path prefix", Config{URL: "https://render.svc/vllm", Timeout: time.Second, MaxConcurrency: 4}, ""},
		{"no url", Config{}, "url: required"},
		{"not http", Config{URL: "tcp://127.0.0.1:1"}, "url: want an http"},
		{"no host", Config{URL: "http:///v1"}, "url: want an http"},
		{"a query", Config{URL: "http://h:1/?a=b"}, "url: want an http"},
		{"credentials", Config{URL: "http://u:p@h:1"}, "url: must not carry credentials"},
		{"negative timeout", Config{URL: "http://h:1", Timeout: -1}, "timeout:"},
		{"negative concurrency", Config{URL: "http://h:1", MaxConcurrency: -1}, "max_concurrency:"},
		{"a key file", Config{URL: "http://h:1", APIKeyFile: "/run/secrets/key"}, ""},
		{"a key variable", Config{URL: "http://h:1", APIKeyEnv: "RENDER_API_KEY"}, ""},
		{"both key sources", Config{URL: "http://h:1", APIKeyFile: "/k", APIKeyEnv: "K"}, "api_key_file: only one of api_key_file and api_key_env"},
		{"a key variable that is no name", Config{URL: "http://h:1", APIKeyEnv: "RENDER KEY"}, "api_key_env: want an environment variable name"},
		{"a key variable starting with a digit", Config{URL: "http://h:1", APIKeyEnv: "1KEY"}, "api_key_env:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.NotContains(t, err.Error(), ":p@", "credentials are not echoed")
		})
	}
}

// TestDefaultTransportHasNoProxy: the client's own transport reads no proxy from the
// environment.
func TestDefaultTransportHasNoProxy(t *testing.T) {
	c, err := New(Config{URL: "http://127.0.0.1:1"}, "m", 10, nil, nil)
	require.NoError(t, err)
	tr, ok := c.http.Transport.(*http.Transport)
	require.True(t, ok)
	assert.Nil(t, tr.Proxy, "render servers sit beside kvroute: no proxy from the environment")
	assert.Equal(t, DefaultConfig().MaxConcurrency, cap(c.slots))
}

// TestClientSendsTheAPIKey: with a key the client sends "Authorization: Bearer KEY",
// without one no Authorization header; a 401 or 403 is the unauthorized outcome, whose
// error names the keys to set and quotes no key; SetAPIKey changes the next render's.
func TestClientSendsTheAPIKey(t *testing.T) {
	var got []string
	srv := renderServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got = append(got, r.Header.Get("Authorization"))
		switch r.Header.Get("Authorization") {
		case "Bearer k1":
			_, _ = io.WriteString(w, `[{"token_ids":[1]}]`)
		case "Bearer old":
			w.WriteHeader(http.StatusForbidden)
		default:
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"error":"Unauthorized"}`)
		}
	})
	keyFile := filepath.Join(t.TempDir(), "key")
	require.NoError(t, os.WriteFile(keyFile, []byte("k1\n"), 0o600))
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	withKey, err := New(Config{URL: srv.URL, APIKeyFile: keyFile}, "m", 100, nil, m)
	require.NoError(t, err)
	without, err := New(Config{URL: srv.URL}, "m", 100, nil, m)
	require.NoError(t, err)
	prompt := tokenize.Prompt{Text: "x", Body: []byte(`{"model":"m","prompt":"x"}`)}

	enc, err := withKey.EncodePrompt(context.Background(), prompt)
	require.NoError(t, err)
	assert.Equal(t, []uint32{1}, enc.IDs)
	_, err = without.EncodePrompt(context.Background(), prompt)
	require.ErrorIs(t, err, tokenize.ErrEngine)
	assert.Contains(t, err.Error(), "status 401: the render server wants an API key (api_key_file, api_key_env)")
	withKey.SetAPIKey("old")
	_, err = withKey.EncodePrompt(context.Background(), prompt)
	require.ErrorIs(t, err, tokenize.ErrEngine)
	assert.Contains(t, err.Error(), "status 403")
	assert.NotContains(t, err.Error(), "old")
	withKey.SetAPIKey("")
	_, err = withKey.EncodePrompt(context.Background(), prompt)
	require.ErrorIs(t, err, tokenize.ErrEngine)

	assert.Equal(t, []string{"Bearer k1", "", "Bearer old", ""}, got)
	assert.Equal(t, 1.0, testutil.ToFloat64(m.renders.WithLabelValues("m", OutcomeOK)))
	assert.Equal(t, 3.0, testutil.ToFloat64(m.renders.WithLabelValues("m", OutcomeUnauthorized)))
}

// TestReadAPIKey: the key comes from the file or the variable, trimmed; what holds no
// usable key is an error naming the key, never quoting the file's content.
func TestReadAPIKey(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	t.Setenv("KVROUTE_TEST_KEY", " from-env\n")
	t.Setenv("KVROUTE_TEST_EMPTY", "")
	tests := []struct {
		name string
		cfg  Config
		key  string
		err  string
	}{
		{"no key", Config{}, "", ""},
		{"a file with a final newline", Config{APIKeyFile: file("ok", "sk-abc\n")}, "sk-abc", ""},
		{"a variable", Config{APIKeyEnv: "KVROUTE_TEST_KEY"}, "from-env", ""},
		{"a missing file", Config{APIKeyFile: filepath.Join(dir, "missing")}, "", "api_key_file: open " + filepath.Join(dir, "missing")},
		{"a directory", Config{APIKeyFile: dir}, "", "api_key_file:"},
		{"an empty file", Config{APIKeyFile: file("empty", " \n")}, "", "api_key_file: " + filepath.Join(dir, "empty") + " is empty"},
		{"a large file", Config{APIKeyFile: file("large", strings.Repeat("secretsecret", 1000))}, "", "is larger than 4096 bytes"},
		{"a control character", Config{APIKeyFile: file("ctl", "secret\x00key")}, "", "api_key_file: the value holds a control character"},
		{"two lines", Config{APIKeyFile: file("lines", "secret\nkey\n")}, "", "api_key_file: the value holds a control character"},
		{"an unset variable", Config{APIKeyEnv: "KVROUTE_TEST_UNSET"}, "", "api_key_env: the environment variable KVROUTE_TEST_UNSET is not set or empty"},
		{"an empty variable", Config{APIKeyEnv: "KVROUTE_TEST_EMPTY"}, "", "api_key_env: the environment variable KVROUTE_TEST_EMPTY is not set or empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key, err := tt.cfg.ReadAPIKey()
			if tt.err == "" {
				require.NoError(t, err)
				assert.Equal(t, tt.key, key)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.err)
			assert.NotContains(t, err.Error(), "secret", "the key is not quoted")
		})
	}
}

// TestAPromptWithoutABodyIsNotSent: a prompt that comes without the body it was read
// from (a Responses API request continuing a stored response, whose render vLLM
// refuses) has nothing for the render endpoint, whatever its API: it is unsupported,
// at once, and the engine is not asked.
func TestAPromptWithoutABodyIsNotSent(t *testing.T) {
	asked := 0
	srv := renderServer(t, func(w http.ResponseWriter, _ *http.Request) { asked++ })
	c := newClient(t, srv.URL+"/", time.Minute, prometheus.NewRegistry())
	for _, api := range []tokenize.API{tokenize.APIFromPrompt, tokenize.APIChat, tokenize.APIResponses, tokenize.APIMessages} {
		_, err := c.EncodePrompt(context.Background(), tokenize.Prompt{Chat: tokenize.TextChat("user", "hi"), BodyAPI: api})
		require.ErrorIs(t, err, tokenize.ErrUnsupported, api)
		assert.NotErrorIs(t, err, tokenize.ErrEngine, api)
	}
	assert.Zero(t, asked)
}

const (
	responsesBody = `{"model":"m","input":[{"role":"user","content":"hi"}],"instructions":"be brief","store":false}`
	messagesBody  = `{"model":"m","max_tokens":8,"system":"be brief","messages":[{"role":"user","content":"hi"}]}`
)

// TestClientPostsEachAPIToItsRenderEndpoint: a body is posted, as is, to the render
// endpoint of the API it is written for (the Chat kvroute rebuilt from a Responses or
// Messages body is not what is sent), and the one GenerateRequest of the reply read.
func TestClientPostsEachAPIToItsRenderEndpoint(t *testing.T) {
	var gotPath, gotBody string
	srv := renderServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotPath, gotBody = r.URL.Path, string(b)
		switch r.URL.Path {
		case ResponsesPath:
			_, _ = io.WriteString(w, vllmResponsesReply)
		case MessagesPath, ChatPath:
			_, _ = io.WriteString(w, vllmChatReply)
		case CompletionsPath:
			_, _ = io.WriteString(w, `[{"token_ids":[5,6]}]`)
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	})
	reg := prometheus.NewRegistry()
	c := newClient(t, srv.URL, time.Minute, reg)
	rebuilt := tokenize.TextChat("user", "hi")
	tests := []struct {
		name   string
		prompt tokenize.Prompt
		path   string
		want   []uint32
	}{
		{"responses", tokenize.Prompt{Chat: rebuilt, Body: []byte(responsesBody), BodyAPI: tokenize.APIResponses}, ResponsesPath, []uint32{151644, 872, 198, 13048}},
		{"messages", tokenize.Prompt{Chat: rebuilt, Body: []byte(messagesBody), BodyAPI: tokenize.APIMessages}, MessagesPath, []uint32{151644, 8948, 198, 2610}},
		{"chat, said", tokenize.Prompt{Chat: rebuilt, Body: []byte(chatBody), BodyAPI: tokenize.APIChat}, ChatPath, []uint32{151644, 8948, 198, 2610}},
		{"chat, from the prompt", tokenize.Prompt{Chat: rebuilt, Body: []byte(chatBody)}, ChatPath, []uint32{151644, 8948, 198, 2610}},
		{"completions, said", tokenize.Prompt{Text: "hi", Body: []byte(`{"model":"m","prompt":"hi"}`), BodyAPI: tokenize.APICompletions}, CompletionsPath, []uint32{5, 6}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			enc, err := c.EncodePrompt(context.Background(), tt.prompt)
			require.NoError(t, err)
			assert.Equal(t, tt.want, enc.IDs)
			assert.Empty(t, enc.Text)
			assert.Equal(t, tt.path, gotPath)
			assert.Equal(t, string(tt.prompt.Body), gotBody, "the client's body is sent as is")
		})
	}
	assert.Equal(t, float64(len(tests)), testutil.ToFloat64(c.metrics.renders.WithLabelValues("m", OutcomeOK)))
}

// TestResponsesAndMessagesRenderFailuresWrapErrEngine: a Responses or Messages render
// fails as a chat one does, into the fallback to load: a server too old to serve the
// endpoint (404), a refusal, a reply that is not one GenerateRequest (a completions
// render's list).
func TestResponsesAndMessagesRenderFailuresWrapErrEngine(t *testing.T) {
	for _, api := range []tokenize.API{tokenize.APIResponses, tokenize.APIMessages} {
		body := responsesBody
		if api == tokenize.APIMessages {
			body = messagesBody
		}
		for _, tt := range []struct {
			name    string
			status  int
			reply   string
			outcome string
		}{
			{"an older vLLM", http.StatusNotFound, `{"detail":"Not Found"}`, OutcomeStatus},
			{"vLLM refuses the body", http.StatusBadRequest, `{"error":{"message":"the secret prompt","code":400}}`, OutcomeStatus},
			{"a list", http.StatusOK, `[` + vllmChatReply + `]`, OutcomeBadReply},
			{"no ids", http.StatusOK, `{"request_id":"resp_1","token_ids":[]}`, OutcomeBadReply},
		} {
			t.Run(api.String()+"/"+tt.name, func(t *testing.T) {
				srv := renderServer(t, func(w http.ResponseWriter, _ *http.Request) {
					w.WriteHeader(tt.status)
					_, _ = io.WriteString(w, tt.reply)
				})
				c := newClient(t, srv.URL, time.Minute, prometheus.NewRegistry())
				enc, err := c.EncodePrompt(context.Background(), tokenize.Prompt{Chat: tokenize.TextChat("user", "hi"), Body: []byte(body), BodyAPI: api})
				require.ErrorIs(t, err, tokenize.ErrEngine)
				assert.NotContains(t, err.Error(), "secret")
				assert.Nil(t, enc.IDs)
				assert.Equal(t, 1.0, testutil.ToFloat64(c.metrics.renders.WithLabelValues("m", tt.outcome)))
			})
		}
	}
}
