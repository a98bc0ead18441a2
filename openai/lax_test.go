package openai

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/jsonv"
)

func value(t *testing.T, literal string) jsonv.Value {
	t.Helper()
	v, err := jsonv.Parse([]byte(literal), 4)
	require.NoError(t, err, literal)
	return v
}

// TestLaxBoolReadsWhatPydanticReads pins pydantic v2's lax bool: what vLLM serves,
// kvroute must not refuse, and what vLLM refuses stays refused.
func TestLaxBoolReadsWhatPydanticReads(t *testing.T) {
	tests := []struct {
		literal string
		want    bool
		ok      bool
	}{
		{`true`, true, true}, {`false`, false, true},
		{`1`, true, true}, {`0`, false, true}, {`1.0`, true, true}, {`0.0`, false, true}, {`-0`, false, true}, {`1e0`, true, true},
		{`"1"`, true, true}, {`"0"`, false, true},
		{`"true"`, true, true}, {`"True"`, true, true}, {`"TRUE"`, true, true}, {`"yes"`, true, true}, {`"Y"`, true, true}, {`"on"`, true, true}, {`"t"`, true, true},
		{`"false"`, false, true}, {`"no"`, false, true}, {`"N"`, false, true}, {`"off"`, false, true}, {`"f"`, false, true},
		{`2`, false, false}, {`-1`, false, false}, {`0.5`, false, false},
		{`""`, false, false}, {`" true"`, false, false}, {`"01"`, false, false}, {`"maybe"`, false, false},
		{`null`, false, false}, {`[]`, false, false}, {`{}`, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.literal, func(t *testing.T) {
			got, ok := laxBool(value(t, tt.literal))
			assert.Equal(t, tt.ok, ok, "accepted")
			assert.Equal(t, tt.want, got)
		})
	}
}

// TestLaxIntReadsWhatPydanticReads pins pydantic v2's lax int (ints past int64 are
// read as the nearest int64).
func TestLaxIntReadsWhatPydanticReads(t *testing.T) {
	tests := []struct {
		literal string
		want    int64
		ok      bool
	}{
		{`100`, 100, true}, {`-1`, -1, true}, {`100.0`, 100, true}, {`1e3`, 1000, true}, {`-0.0`, 0, true},
		{`true`, 1, true}, {`false`, 0, true},
		{`"100"`, 100, true}, {`" 100 "`, 100, true}, {`"+7"`, 7, true}, {`"-7"`, -7, true}, {`"007"`, 7, true},
		{`"1_000"`, 1000, true}, {`"100.00"`, 100, true},
		{`100000000000000000000`, math.MaxInt64, true}, {`-100000000000000000000`, math.MinInt64, true},
		{`1e300`, math.MaxInt64, true}, {`"99999999999999999999"`, math.MaxInt64, true}, {`"-9223372036854775808"`, math.MinInt64, true},
		{`1.5`, 0, false}, {`1e400`, 0, false}, {`"1.5"`, 0, false}, {`"100."`, 0, false}, {`"1__0"`, 0, false}, {`"_1"`, 0, false},
		{`"1_"`, 0, false}, {`""`, 0, false}, {`"+"`, 0, false}, {`"0x10"`, 0, false}, {`"1e3"`, 0, false}, {`"--1"`, 0, false},
		{`null`, 0, false}, {`[]`, 0, false}, {`{}`, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.literal, func(t *testing.T) {
			got, ok := laxInt(value(t, tt.literal))
			assert.Equal(t, tt.ok, ok, "accepted")
			assert.Equal(t, tt.want, got)
		})
	}
}

// TestParseServesWhatTheEnginesCoerce: a request vLLM's pydantic models accept with a
// value of another JSON type is parsed, not refused with a 400.
func TestParseServesWhatTheEnginesCoerce(t *testing.T) {
	got, err := Parse(Completions, []byte(`{"model":"m","prompt":"x","max_tokens":100.0,"max_completion_tokens":"64","stream":1,"add_special_tokens":"false","truncate_prompt_tokens":"128"}`), DefaultLimits())
	require.NoError(t, err)
	assert.True(t, got.Stream)
	require.NotNil(t, got.AddSpecialTokens)
	assert.False(t, *got.AddSpecialTokens)
	require.NotNil(t, got.TruncatePromptTokens)
	assert.Equal(t, int64(128), *got.TruncatePromptTokens)
	chat, err := Parse(ChatCompletions, []byte(`{"model":"m","messages":[{"role":"assistant","content":"a"}],"add_generation_prompt":0,"continue_final_message":"yes"}`), DefaultLimits())
	require.NoError(t, err)
	assert.False(t, chat.Chat.AddGenerationPrompt)
	assert.True(t, chat.Chat.ContinueFinalMessage)
}

// TestParseReadsTokenIDsAsPydanticDoes: vLLM's prompt is list[int] | list[list[int]] |
// str | list[str] (ints at least 0), which pydantic resolves in smart mode: a member
// the value matches strictly, else the first it matches in lax mode. So an array of
// strings is a batch of texts, and any other array is token ids, each read as a lax int.
// Pinned against pydantic 2.13.4 (each body through model_validate_json); kvroute also
// keeps every id below 2³², where vLLM takes 4294967296.0 and refuses it later.
func TestParseReadsTokenIDsAsPydanticDoes(t *testing.T) {
	accepted := []struct {
		prompt string
		ids    []uint32
		text   string
	}{
		{`[1.0,2.0,3.0]`, []uint32{1, 2, 3}, ""},
		{`[1e2,7]`, []uint32{100, 7}, ""},
		{`[100e-2,4294967295.0]`, []uint32{1, 4294967295}, ""},
		{`[-0,-0.0]`, []uint32{0, 0}, ""},
		{`[true,2]`, []uint32{1, 2}, ""},
		{`[false]`, []uint32{0}, ""},
		{`[[1.0,2]]`, []uint32{1, 2}, ""},
		{`[[false,true]]`, []uint32{0, 1}, ""},
		{`[["1","2"]]`, []uint32{1, 2}, ""},
		{`["1",2]`, []uint32{1, 2}, ""},
		{`[2,"1"]`, []uint32{2, 1}, ""},
		{`[" +1_0 ",1]`, []uint32{10, 1}, ""},
		{`["1","2"]`, nil, "1"}, // list[str] matches strictly
	}
	for _, tt := range accepted {
		t.Run(tt.prompt, func(t *testing.T) {
			got, err := Parse(Completions, []byte(`{"model":"m","prompt":`+tt.prompt+`}`), DefaultLimits())
			require.NoError(t, err)
			assert.Equal(t, tt.ids, got.Tokens)
			assert.Equal(t, tt.text, got.Prompt)
		})
	}
	for _, prompt := range []string{`[1.5]`, `[5e-1]`, `[1,2.5]`, `[-1.0]`, `["-1",2]`, `["a",2]`, `[1,"x"]`, `["1.5",2]`,
		`[1,null]`, `["1",[2]]`, `[1,[2]]`, `[1e400]`, `[4294967296.0]`, `["4294967296",1]`, `[[1,true,"x"]]`} {
		t.Run(prompt, func(t *testing.T) {
			_, err := Parse(Completions, []byte(`{"model":"m","prompt":`+prompt+`}`), DefaultLimits())
			var fe *FieldError
			require.ErrorAs(t, err, &fe)
			assert.Equal(t, "prompt", fe.Param)
			assert.Contains(t, err.Error(), "[0, 2^32)")
		})
	}
}
