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
		// The Responses API: input_tokens count every prompt token.
		{"Responses body", `{"id":"resp_1","usage":{"input_tokens":3000,"input_tokens_details":{"cached_tokens":2944},"output_tokens":20,"total_tokens":3020}}`,
			Usage{3000, 2944}, true, false},
		{"Responses stream's completed event", "event: response.completed\ndata: " + `{"type":"response.completed","response":{"id":"resp_1","usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":4},"output_tokens":3}}}` + "\n\n",
			Usage{10, 4}, true, false},
		// Anthropic's Messages API: cache reads and writes are counted apart from input_tokens.
		{"Messages body with cache fields", `{"id":"msg_1","type":"message","usage":{"input_tokens":56,"output_tokens":20,"cache_read_input_tokens":2944,"cache_creation_input_tokens":0}}`,
			Usage{3000, 2944}, true, false},
		{"Messages body without cache fields (prompt details off)", `{"type":"message","usage":{"input_tokens":3000,"output_tokens":20}}`,
			Usage{3000, 0}, true, false},
		{"Messages stream's message_delta", "event: message_start\ndata: " + `{"type":"message_start","message":{"usage":{"input_tokens":0,"output_tokens":0}}}` + "\n\n" +
			"event: message_delta\ndata: " + `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":6,"output_tokens":3,"cache_read_input_tokens":4,"cache_creation_input_tokens":null}}` + "\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
			Usage{10, 4}, true, false},
		// SGLang's native generate: meta_info counts the cached tokens beside the prompt.
		{"SGLang answer", `{"text":"hi","output_ids":[5,6],"meta_info":{"id":"r","finish_reason":{"type":"length","length":2},"prompt_tokens":3000,"completion_tokens":2,"cached_tokens":2944,"e2e_latency":0.1}}`,
			Usage{3000, 2944}, true, false},
		{"SGLang stream's last chunk", `data: {"text":"h","meta_info":{"prompt_tokens":9,"cached_tokens":0}}` + "\n\n" + `data: {"text":"hi","meta_info":{"prompt_tokens":10,"cached_tokens":8}}` + "\n\ndata: [DONE]\n\n",
			Usage{10, 8}, true, false},
		{"meta_info without prompt tokens is none", `{"meta_info":{"id":"r"}}`, Usage{}, false, false},
		{"meta_info cached above prompt", `{"meta_info":{"prompt_tokens":10,"cached_tokens":11}}`, Usage{}, true, true},
		{"meta_info cached not a number", `{"meta_info":{"prompt_tokens":10,"cached_tokens":"8"}}`, Usage{}, true, true},
		{"a later usage wins over an earlier meta_info", `{"meta_info":{"prompt_tokens":1}}` + "\n" + `{"usage":{"prompt_tokens":7}}`, Usage{7, 0}, true, false},
		{"input tokens not a number", `{"usage":{"input_tokens":"10"}}`, Usage{}, true, true},
		{"negative cache read", `{"usage":{"input_tokens":10,"cache_read_input_tokens":-1}}`, Usage{}, true, true},
		{"input tokens adding up past 2^31", `{"usage":{"input_tokens":2147483648,"cache_read_input_tokens":2147483648}}`, Usage{}, true, true},
		{"Responses cached above input", `{"usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":11}}}`, Usage{}, true, true},
		{"a usage of neither shape", `{"usage":{"output_tokens":3}}`, Usage{}, false, false},
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
