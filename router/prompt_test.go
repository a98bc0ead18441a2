package router

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/jsonv"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenize"
	"github.com/kvroute/kvroute/tokenize/template"
)

// stubEncoder answers every prompt with ids or err, counting its calls.
type stubEncoder struct {
	ids   []uint32
	err   error
	calls int
}

func (s *stubEncoder) EncodePrompt(context.Context, tokenize.Prompt) (tokenize.Encoding, error) {
	s.calls++
	return tokenize.Encoding{Text: "text", IDs: s.ids}, s.err
}

// byModel gives each model its encoder.
type byModel map[string]tokenize.PromptEncoder

func (b byModel) Model(name string) tokenize.PromptEncoder { return b[name] }

func promptRouter(t *testing.T, tokenizers Tokenizers, reg prometheus.Registerer) (*Router, *index.Index) {
	t.Helper()
	idx, err := index.New(index.Config{CapacityBlocks: 100}, nil)
	require.NoError(t, err)
	workers := []Worker{{Name: "a", Address: "127.0.0.1:8001", Models: []string{"m", "other"}}}
	require.NoError(t, idx.SetWorker("a", 0))
	picker, err := scoring.NewKVCost(scoring.DynamoParams(), nil)
	require.NoError(t, err)
	r, err := New(Config{BlockSize: 2, Workers: workers}, Deps{Tokenizers: tokenizers, Metrics: NewMetrics(reg),
		Index: idx, Bookings: scoring.NewBookings(), Picker: picker, RecordBlocks: true})
	require.NoError(t, err)
	return r, idx
}

// TestPromptErrorsAreRefusedOrRoutedByLoad pins how an encoder's error becomes a
// decision: a template's refusal and an empty chat are the client's 400; anything else
// (media parts, an engine that failed, a render or tokenizer failure) routes the request
// by load as an empty prompt, counted by reason.
func TestPromptErrorsAreRefusedOrRoutedByLoad(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		refused  bool
		fallback string
	}{
		{"the template refused the chat", fmt.Errorf("render: %w", tokenize.ErrRefused), true, ""},
		{"a chat without messages", tokenize.ErrNoMessages, true, ""},
		{"media content", fmt.Errorf("render: %w", tokenize.ErrUnsupported), false, FallbackUnsupported},
		{"the engine failed", fmt.Errorf("%w: timeout", tokenize.ErrEngine), false, FallbackEngine},
		{"any other failure", errors.New("rendered prompt too large"), false, FallbackError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			r, _ := promptRouter(t, byModel{"m": &stubEncoder{err: tt.err}}, reg)
			d, err := r.Route(context.Background(), &Request{Model: "m", Chat: tokenize.TextChat("user", "hi")})
			if tt.refused {
				require.ErrorIs(t, err, ErrBadRequest)
				assert.Nil(t, d)
				return
			}
			require.NoError(t, err, "never failed")
			defer d.Release()
			assert.Equal(t, tt.fallback, d.PromptFallback)
			assert.Equal(t, "a", d.Worker)
			assert.Zero(t, d.PromptTokens)
			assert.Zero(t, d.Blocks)
			assert.Equal(t, 1.0, testutil.ToFloat64(fallbacksOn(t, reg).fallbacks.WithLabelValues(tt.fallback)))
		})
	}
}

// cutEncoder answers every prompt with the first ids of a longer one, leaving rest
// bytes out.
type cutEncoder struct {
	ids  []uint32
	rest int
}

func (c cutEncoder) EncodePrompt(context.Context, tokenize.Prompt) (tokenize.Encoding, error) {
	return tokenize.Encoding{Text: "text", IDs: c.ids, Rest: c.rest}, nil
}

// TestCutPromptIsRoutedOnItsFirstIDs: a prompt whose encoder stopped early (its first
// ids, and the bytes it left out) is routed on the full blocks of those ids, not by load
// alone; its length, its booked prefill (P) and the trace's prompt_tokens add the rest
// at four bytes a token, and it is counted. With truncate_prompt_tokens (but -1) its
// length decides whether the engine cuts it, unknown here: it is routed by load.
func TestCutPromptIsRoutedOnItsFirstIDs(t *testing.T) {
	ids := []uint32{1, 2, 3, 4, 5}
	minusOne, hundred := int64(-1), int64(100)
	tests := []struct {
		name         string
		truncate     *int64
		wantFallback string
	}{
		{"no truncate_prompt_tokens", nil, ""},
		{"truncate_prompt_tokens -1 (the model's length)", &minusOne, ""},
		{"truncate_prompt_tokens past the ids", &hundred, FallbackUnsupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			r, idx := promptRouter(t, byModel{"m": cutEncoder{ids: ids, rest: 4001}}, reg)
			d, err := r.Route(context.Background(), &Request{Model: "m", Prompt: "x", TruncatePromptTokens: tt.truncate})
			require.NoError(t, err)
			defer d.Release()
			assert.Equal(t, tt.wantFallback, d.PromptFallback)
			cuts := testutil.ToFloat64(r.prompter.Metrics.cuts)
			if tt.wantFallback != "" {
				assert.Zero(t, d.PromptTokens)
				assert.Zero(t, cuts)
				return
			}
			assert.Equal(t, 5+1001, d.PromptTokens, "the ids and the rest at 4 bytes a token, rounded up")
			assert.Equal(t, 1001, d.PromptEstimatedTokens)
			assert.Equal(t, 2, d.Blocks, "the full blocks of the ids (block size 2)")
			assert.Equal(t, 5+1001, r.deps.Bookings.Load("a").PrefillTokens, "P books the estimate")
			assert.Equal(t, 1.0, cuts)
			want := index.BlockHashes(nil, ids, 2, index.Salt("m", "", ""))
			held := make([]int, 1)
			idx.Overlaps(want, []string{"a"}, held)
			assert.Equal(t, []int{2}, held, "the blocks of the ids are recorded")
		})
	}
}

// TestPromptOverTheRenderLimitIsRoutedByLoad: a chat whose tools the model's template
// would pretty-print past the renderer's output limit is refused by the renderer before
// it prints them (template.ErrOutputTooLarge), and the request is routed by load,
// counted as an "error" fallback, not failed.
func TestPromptOverTheRenderLimitIsRoutedByLoad(t *testing.T) {
	r, err := template.New(`{{ tools | tojson(indent=4) }}{% for m in messages %}{{ m.content }}{% endfor %}`, template.Tokens{},
		template.Options{MaxOutputBytes: 1 << 10})
	require.NoError(t, err)
	tools, err := jsonv.Parse([]byte(`[{"type": "function", "function": {"name": "f", "parameters": `+
		strings.Repeat("[", 20)+strings.Repeat("0,", 99)+"0"+strings.Repeat("]", 20)+`}}]`), 64)
	require.NoError(t, err)
	chat := tokenize.TextChat("user", "hi")
	chat.Tools = tools.Items()
	encoder := tokenize.Pipeline{Tokenizer: tokenize.Approx{}, Renderer: r}

	p := Prompter{BlockSize: 2, Tokenizers: byModel{"m": encoder}}
	prompt, err := p.Prompt(context.Background(), &Request{Model: "m", Chat: chat})
	require.NoError(t, err)
	assert.Equal(t, FallbackError, prompt.Fallback)
	require.ErrorIs(t, prompt.FallbackErr, template.ErrOutputTooLarge)

	reg := prometheus.NewRegistry()
	rt, _ := promptRouter(t, byModel{"m": encoder}, reg)
	d, err := rt.Route(context.Background(), &Request{Model: "m", Chat: chat})
	require.NoError(t, err, "never failed")
	defer d.Release()
	assert.Equal(t, FallbackError, d.PromptFallback)
	assert.Equal(t, "a", d.Worker)
	assert.Equal(t, 1.0, testutil.ToFloat64(fallbacksOn(t, reg).fallbacks.WithLabelValues(FallbackError)))
}

// TestChatsTheRenderersDoNotRenderAreRoutedByLoad: a chat the in-process renderers do
// not render (tokenize.Chat.Unread) is routed by load, never failed, and counted under
// its reason, while an encoder that asks the engine, which reads the body itself, still
// encodes it:
//   - a chat over the parser's value budget (the body is syntax-checked but its values
//     are not materialised): an "error" fallback, like a prompt over the render limit;
//   - a chat naming its own chat_template (vLLM renders it with the request's template,
//     or refuses it): unsupported_content.
func TestChatsTheRenderersDoNotRenderAreRoutedByLoad(t *testing.T) {
	tests := []struct {
		name, body, reason string
	}{
		{"over the value budget", `{"model":"m","messages":[{"role":"user","content":"hi","x":[` + strings.Repeat("0,", 1<<16) + `0]}]}`, FallbackError},
		{"naming its own template", `{"model":"m","messages":[{"role":"user","content":"hi"}],"chat_template":"{{ messages[0].content }}"}`, FallbackUnsupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := []byte(tt.body)
			parsed, err := openai.Parse(openai.ChatCompletions, body, openai.DefaultLimits())
			require.NoError(t, err)
			require.Error(t, parsed.Chat.Unread)
			req := &Request{Model: "m", Chat: parsed.Chat, Body: body}

			reg := prometheus.NewRegistry()
			r, _ := promptRouter(t, byModel{"m": tokenize.Pipeline{Tokenizer: tokenize.Approx{}, Renderer: tokenize.ChatML{}}}, reg)
			d, err := r.Route(context.Background(), req)
			require.NoError(t, err, "never failed")
			assert.Equal(t, tt.reason, d.PromptFallback)
			assert.Equal(t, 1.0, testutil.ToFloat64(fallbacksOn(t, reg).fallbacks.WithLabelValues(tt.reason)))
			d.Release()

			engine := &stubEncoder{ids: []uint32{1, 2, 3, 4}}
			r, _ = promptRouter(t, byModel{"m": engine}, prometheus.NewRegistry())
			d, err = r.Route(context.Background(), req)
			require.NoError(t, err)
			defer d.Release()
			assert.Empty(t, d.PromptFallback)
			assert.Equal(t, 4, d.PromptTokens)
		})
	}
}

// fallbacksOn reads the fallback counters registered on reg.
func fallbacksOn(t *testing.T, reg *prometheus.Registry) *Metrics {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x"}, []string{"reason"})
	for _, f := range families {
		if f.GetName() != "kvroute_router_prompt_fallbacks_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			v.WithLabelValues(m.GetLabel()[0].GetValue()).Add(m.GetCounter().GetValue())
		}
	}
	return &Metrics{fallbacks: v}
}

// TestPromptIsEncodedByTheModelsEncoder: each model's prompt goes to its own encoder
// (once per request), the model salts the hashes, and a model no worker serves is
// refused before its prompt costs anything.
func TestPromptIsEncodedByTheModelsEncoder(t *testing.T) {
	m, other := &stubEncoder{ids: []uint32{1, 2, 3, 4}}, &stubEncoder{ids: []uint32{1, 2, 3, 4}}
	unserved := &stubEncoder{ids: []uint32{1}}
	r, _ := promptRouter(t, byModel{"m": m, "other": other, "unserved": unserved}, nil)
	ctx := context.Background()

	d, err := r.Route(ctx, &Request{Model: "m", Prompt: "x"})
	require.NoError(t, err)
	d.Release()
	assert.Equal(t, 1, m.calls)
	assert.Equal(t, 0, other.calls)
	assert.Equal(t, 2, d.Blocks)

	p1, err := r.prompter.Prompt(ctx, &Request{Model: "m", Prompt: "x"})
	require.NoError(t, err)
	p2, err := r.prompter.Prompt(ctx, &Request{Model: "other", Prompt: "x"})
	require.NoError(t, err)
	assert.Equal(t, p1.Tokens, p2.Tokens)
	assert.NotEqual(t, p1.Blocks, p2.Blocks, "the model salts the blocks")

	_, err = r.Route(ctx, &Request{Model: "unserved", Prompt: "x"})
	require.Error(t, err)
	assert.Zero(t, unserved.calls, "refused before encoding")

	tokens := &stubEncoder{}
	r, _ = promptRouter(t, byModel{"m": tokens}, nil)
	d, err = r.Route(ctx, &Request{Model: "m", Tokens: []uint32{5, 6}})
	require.NoError(t, err)
	d.Release()
	assert.Zero(t, tokens.calls, "a prompt of token ids is not encoded")
	assert.Equal(t, 1, d.Blocks)
}

// hookEncoder runs during before it answers: a render that takes a while.
type hookEncoder struct {
	ids    []uint32
	during func()
}

func (h hookEncoder) EncodePrompt(context.Context, tokenize.Prompt) (tokenize.Encoding, error) {
	h.during()
	return tokenize.Encoding{Text: "text", IDs: h.ids}, nil
}

// TestWorkersAreThoseOfAfterThePrompt pins that candidates are taken once the prompt is
// encoded: a worker removed while an engine renders is not chosen, and a model nobody
// serves is refused before any encoding.
func TestWorkersAreThoseOfAfterThePrompt(t *testing.T) {
	var r *Router
	removed := Worker{Name: "b", Address: "127.0.0.1:8002", Models: []string{"m"}}
	encoder := hookEncoder{ids: []uint32{1, 2, 3, 4}, during: func() {
		require.NoError(t, r.SetWorkers([]Worker{removed})) // "a" leaves mid-render
	}}
	unserved := &stubEncoder{ids: []uint32{1, 2}}
	r, idx := promptRouter(t, byModel{"m": encoder, "nobody": unserved}, nil)
	require.NoError(t, idx.SetWorker("b", 0))

	d, err := r.Route(context.Background(), &Request{Model: "m", Chat: tokenize.TextChat("user", "hi")})
	require.NoError(t, err)
	defer d.Release()
	assert.Equal(t, "b", d.Worker, "the worker removed during the render is not a candidate")

	_, err = r.Route(context.Background(), &Request{Model: "nobody", Chat: tokenize.TextChat("user", "hi")})
	require.ErrorIs(t, err, ErrModelNotFound)
	assert.Zero(t, unserved.calls, "refused before its prompt costs anything")
}

// TestPromptTruncatedByTheEngineIsRoutedByLoad: a request whose truncate_prompt_tokens
// cuts its prompt is not hashed on the untruncated ids the engine never sees: which side
// the engine cuts depends on its tokenizer's truncation_side, so it is routed by load.
// A prompt within the limit (or the limit -1, the engine's max_model_len) is unchanged.
func TestPromptTruncatedByTheEngineIsRoutedByLoad(t *testing.T) {
	ids := []uint32{1, 2, 3, 4, 5, 6}
	limit := func(n int64) *int64 { return &n }
	tests := []struct {
		name     string
		req      Request
		fallback string
	}{
		{"text over the limit", Request{Model: "m", Prompt: "x", TruncatePromptTokens: limit(4)}, FallbackUnsupported},
		{"token ids over the limit", Request{Model: "m", Tokens: ids, TruncatePromptTokens: limit(5)}, FallbackUnsupported},
		{"within the limit", Request{Model: "m", Prompt: "x", TruncatePromptTokens: limit(6)}, ""},
		{"max_model_len", Request{Model: "m", Prompt: "x", TruncatePromptTokens: limit(-1)}, ""},
		{"no limit", Request{Model: "m", Prompt: "x"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Prompter{BlockSize: 2, Tokenizers: byModel{"m": &stubEncoder{ids: ids}}}
			got, err := p.Prompt(context.Background(), &tt.req)
			require.NoError(t, err)
			assert.Equal(t, tt.fallback, got.Fallback)
			if tt.fallback != "" {
				assert.Empty(t, got.Tokens)
				assert.ErrorIs(t, got.FallbackErr, tokenize.ErrUnsupported)
				return
			}
			assert.Equal(t, ids, got.Tokens)
		})
	}
}

// gaveUpEncoder fails as an engine render does when its request's context ends during
// the call: the caller gave up while the prompt was encoded.
type gaveUpEncoder struct{ cancel context.CancelFunc }

func (g gaveUpEncoder) EncodePrompt(ctx context.Context, _ tokenize.Prompt) (tokenize.Encoding, error) {
	g.cancel()
	return tokenize.Encoding{}, fmt.Errorf("%w: %w", tokenize.ErrEngine, ctx.Err())
}

// TestARequestWhoseStreamIsGoneIsNeitherEncodedNorAFallback: Envoy gives up on a stream
// (its message_timeout) while kvroute is busy. A request already gone is not encoded
// (under overload that work only lengthens the backlog), and one that went while it
// was encoded is not counted as a prompt fallback: both end with the context's error,
// which the filter counts as cancelled, and nothing is booked.
func TestARequestWhoseStreamIsGoneIsNeitherEncodedNorAFallback(t *testing.T) {
	t.Run("gone before its prompt is encoded", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		enc := &stubEncoder{ids: []uint32{1, 2, 3, 4}}
		r, _ := promptRouter(t, byModel{"m": enc}, reg)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		d, err := r.Route(ctx, &Request{Model: "m", Chat: tokenize.TextChat("user", "hi")})
		require.ErrorIs(t, err, context.Canceled)
		assert.Nil(t, d)
		assert.Zero(t, enc.calls, "the prompt was encoded for a stream already gone")
		assert.Zero(t, fallbacksCounted(t, reg))
	})
	t.Run("gone while its prompt is encoded", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		ctx, cancel := context.WithCancel(context.Background())
		r, _ := promptRouter(t, byModel{"m": gaveUpEncoder{cancel}}, reg)
		d, err := r.Route(ctx, &Request{Model: "m", Chat: tokenize.TextChat("user", "hi")})
		require.ErrorIs(t, err, context.Canceled)
		assert.Nil(t, d)
		assert.Zero(t, fallbacksCounted(t, reg), "counted as a fallback")
	})
}

// fallbacksCounted is the prompt fallbacks counted, every reason.
func fallbacksCounted(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	m := fallbacksOn(t, reg)
	total := 0.0
	for _, reason := range []string{FallbackUnsupported, FallbackEngine, FallbackError} {
		total += testutil.ToFloat64(m.fallbacks.WithLabelValues(reason))
	}
	return total
}

// TestPromptsAreCountedWithTheirDecision: a prompt's fallback and its cut are counted
// once, with the decision that routes the request, not at each routing tried: a
// request refused for capacity is not routed by load nor on its first ids, and flow
// control tries a held request again at each change of the bookings.
func TestPromptsAreCountedWithTheirDecision(t *testing.T) {
	for _, tc := range []struct {
		name    string
		encoder tokenize.PromptEncoder
		counted func(r *Router, reg *prometheus.Registry) float64
	}{
		{"a fallback", &stubEncoder{err: fmt.Errorf("%w: timeout", tokenize.ErrEngine)},
			func(_ *Router, reg *prometheus.Registry) float64 { return fallbacksCounted(t, reg) }},
		{"a cut", cutEncoder{ids: []uint32{1, 2, 3, 4, 5}, rest: 4001},
			func(r *Router, _ *prometheus.Registry) float64 { return testutil.ToFloat64(r.prompter.Metrics.cuts) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			r, _ := promptRouter(t, byModel{"m": tc.encoder}, reg)
			r.maxActive = 1
			req := func() *Request { return &Request{Model: "m", Chat: tokenize.TextChat("user", "hi")} }
			holder, err := r.Route(context.Background(), req())
			require.NoError(t, err)
			assert.Equal(t, 1.0, tc.counted(r, reg), "the holder's")
			for range 3 {
				_, err := r.Route(context.Background(), req())
				require.ErrorIs(t, err, ErrOverloaded)
			}
			assert.Equal(t, 1.0, tc.counted(r, reg), "refused requests counted")
			holder.Release()
			d, err := r.Route(context.Background(), req())
			require.NoError(t, err)
			d.Release()
			assert.Equal(t, 2.0, tc.counted(r, reg))
		})
	}
}
