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
