package openai

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseUsage(t *testing.T) {
	tests := []struct {
		name    string
		tail    string
		want    Usage
		found   bool
		invalid bool
	}{
		{"SSE final chunk", `data: {"choices":[],"usage":{"prompt_tokens":3000,"completion_tokens":20,"prompt_tokens_details":{"cached_tokens":2944}}}` + "\n\ndata: [DONE]\n\n",
			Usage{3000, 2944}, true, false},
		{"the last of several usage chunks", `data: {"usage":{"prompt_tokens":10}}` + "\n\n" + `data: {"usage":{"prompt_tokens":20,"prompt_tokens_details":null}}` + "\n\n",
			Usage{20, 0}, true, false},
		{"whole JSON body", `{"id":"x","choices":[{"text":"say \"usage\": 5"}],"usage" : {"prompt_tokens":7,"prompt_tokens_details":{"cached_tokens":0}}}`,
			Usage{7, 0}, true, false},
		{"usage text inside content is not usage", `data: {"choices":[{"delta":{"content":"\"usage\":{\"prompt_tokens\":9}"}}]}`, Usage{}, false, false},
		{"no usage", `data: {"choices":[]}`, Usage{}, false, false},
		{"usage cut by the tail", `ompt_tokens":7}}`, Usage{}, false, false},
		{"negative prompt tokens", `{"usage":{"prompt_tokens":-1}}`, Usage{}, true, true},
		{"negative cached tokens", `{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":-5}}}`, Usage{}, true, true},
		{"huge value", `{"usage":{"prompt_tokens":1e300}}`, Usage{}, true, true},
		{"above 2^31", `{"usage":{"prompt_tokens":2147483649}}`, Usage{}, true, true},
		{"fraction", `{"usage":{"prompt_tokens":1.5}}`, Usage{}, true, true},
		{"string", `{"usage":{"prompt_tokens":"10"}}`, Usage{}, true, true},
		{"cached above prompt", `{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":11}}}`, Usage{}, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, found, err := ParseUsage([]byte(tt.tail))
			assert.Equal(t, tt.found, found)
			if tt.invalid {
				require.ErrorIs(t, err, ErrBadUsage)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}
