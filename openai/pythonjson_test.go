package openai

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/tokenize"
)

// vLLM (and SGLang) read a request body with FastAPI: Starlette's Request.json() is
// json.loads(body) on the body's bytes, and the result is validated by pydantic in lax
// mode. A body Python's json accepts and pydantic validates is served by the engine, so
// kvroute must not refuse it as malformed: these tests hold kvroute to the JSON Python
// reads where it is wider than RFC 8259.

const utf8BOM = "\xef\xbb\xbf"

// json.loads of bytes decodes them with detect_encoding, which is "utf-8-sig" for bytes
// opening with a UTF-8 byte order mark: the mark is dropped, not an error.
func TestABodyOpeningWithAUTF8ByteOrderMarkIsRead(t *testing.T) {
	chat := utf8BOM + ` {"model":"m","messages":[{"role":"user","content":"x"}]}`
	got, err := Parse(ChatCompletions, []byte(chat), DefaultLimits())
	require.NoError(t, err)
	assert.Equal(t, "m", got.Model)
	text, err := tokenize.ChatML{}.Render(got.Chat)
	require.NoError(t, err)
	assert.Equal(t, "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n", text)

	got, err = Parse(Completions, []byte(utf8BOM+`{"model":"m","prompt":"p"}`), DefaultLimits())
	require.NoError(t, err)
	assert.Equal(t, "p", got.Prompt)

	model, err := ParseModel([]byte(chat), DefaultLimits())
	require.NoError(t, err)
	assert.Equal(t, "m", model)

	out, err := SetModel([]byte(chat), "n", DefaultLimits())
	require.NoError(t, err)
	assert.Equal(t, utf8BOM+` {"model":"n","messages":[{"role":"user","content":"x"}]}`, string(out))

	resp, err := ParseResponses([]byte(utf8BOM+`{"model":"m","input":"x"}`), DefaultLimits())
	require.NoError(t, err)
	assert.Equal(t, "m", resp.Model)

	msgs, err := ParseMessages([]byte(utf8BOM+`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`), DefaultLimits())
	require.NoError(t, err)
	assert.Equal(t, "m", msgs.Model)
}

// Python refuses a mark anywhere but at the very start, and a second one.
func TestAByteOrderMarkElsewhereIsRefused(t *testing.T) {
	for _, body := range []string{
		" " + utf8BOM + `{"model":"m","prompt":"p"}`,
		utf8BOM + utf8BOM + `{"model":"m","prompt":"p"}`,
		`{"model":"m","prompt":"p"}` + utf8BOM,
		`{` + utf8BOM + `"model":"m","prompt":"p"}`,
	} {
		_, err := Parse(Completions, []byte(body), DefaultLimits())
		require.Error(t, err, "%q", body)
		assert.Contains(t, err.Error(), "not valid JSON", "%q", body)
	}
}

// Python's json reads NaN, Infinity and -Infinity as floats (allow_nan is its default),
// and pydantic's float fields, its Any and dict values, and vLLM's extra fields
// (OpenAIBaseModel has extra="allow") take them: vLLM serves these bodies.
func TestNonFiniteNumbersAreReadAsPythonReadsThem(t *testing.T) {
	chat := `{"model":"m","temperature":NaN,"logit_bias":{"50256":-Infinity},"x_extra":Infinity,` +
		`"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"number","maximum":Infinity}}}],` +
		`"messages":[{"role":"user","content":"x"}]}`
	got, err := Parse(ChatCompletions, []byte(chat), DefaultLimits())
	require.NoError(t, err)
	require.Len(t, got.Chat.Tools, 1)
	params, _ := got.Chat.Tools[0].Get("function")
	params, _ = params.Get("parameters")
	assert.Equal(t, `{"type":"number","maximum":Infinity}`, string(params.AppendCompact(nil)))

	got, err = Parse(Completions, []byte(`{"model":"m","prompt":"p","temperature":-Infinity,"top_p":NaN}`), DefaultLimits())
	require.NoError(t, err)
	assert.Equal(t, "p", got.Prompt)

	_, err = ParseModel([]byte(chat), DefaultLimits())
	require.NoError(t, err)
	_, err = SetModel([]byte(chat), "n", DefaultLimits())
	require.NoError(t, err)
	_, err = ParseResponses([]byte(`{"model":"m","input":"x","temperature":NaN}`), DefaultLimits())
	require.NoError(t, err)
}

// pydantic's int and bool fields refuse a non-finite float, so kvroute refuses them for
// the field, as before (not as malformed JSON).
func TestNonFiniteNumbersAreRefusedWhereAnIntOrABoolIs(t *testing.T) {
	for _, tt := range []struct{ body, param string }{
		{`{"model":"m","prompt":"p","max_tokens":NaN}`, "max_tokens"},
		{`{"model":"m","prompt":"p","max_tokens":Infinity}`, "max_tokens"},
		{`{"model":"m","prompt":"p","truncate_prompt_tokens":-Infinity}`, "truncate_prompt_tokens"},
		{`{"model":"m","prompt":"p","stream":NaN}`, "stream"},
		{`{"model":"m","prompt":[1,NaN]}`, "prompt"},
		{`{"model":"m","prompt":[Infinity]}`, "prompt"},
	} {
		_, err := Parse(Completions, []byte(tt.body), DefaultLimits())
		require.Error(t, err, tt.body)
		var fe *FieldError
		require.ErrorAs(t, err, &fe, tt.body)
		assert.Equal(t, tt.param, fe.Param, tt.body)
	}
}

// Only Python's three spellings: json.loads refuses the rest.
func TestOtherNonFiniteSpellingsAreRefused(t *testing.T) {
	for _, lit := range []string{"nan", "inf", "Inf", "+Infinity", "-NaN", "infinity", "NaNa", "Infinit", "-", "-I"} {
		body := `{"model":"m","prompt":"p","temperature":` + lit + `}`
		_, err := Parse(Completions, []byte(body), DefaultLimits())
		require.Error(t, err, body)
		assert.Contains(t, err.Error(), "not valid JSON", body)
	}
}
