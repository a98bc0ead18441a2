package engine

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// vllmChatReply is a /v1/chat/completions/render reply as vLLM writes it (GenerateRequest
// dumped by pydantic), trimmed of most sampling parameters.
const vllmChatReply = `{"request_id":"chatcmpl-9b1c","token_ids":[151644,8948,198,2610],"features":null,` +
	`"sampling_params":{"n":1,"temperature":0.7,"max_tokens":16,"stop":[],"logit_bias":null},` +
	`"model":"Qwen/Qwen3-8B","stream":false,"stream_options":null,"cache_salt":null,"priority":0,"kv_transfer_params":null}`

func TestParseChatRender(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		max     int
		want    []uint32
		wantErr string
	}{
		{"vLLM's reply", vllmChatReply, 100, []uint32{151644, 8948, 198, 2610}, ""},
		{"token_ids first, other keys after", `{"token_ids":[1,2],"features":{"mm_hashes":{"image":["x"]}}}`, 100, []uint32{1, 2}, ""},
		{"the largest id", `{"token_ids":[2147483647]}`, 100, []uint32{2147483647}, ""},
		{"an id of 2^31", `{"token_ids":[2147483648]}`, 100, nil, "above 2^31-1"},
		{"an id past 2^32", `{"token_ids":[4294967296]}`, 100, nil, "expected an integer"},
		{"a negative id", `{"token_ids":[-1]}`, 100, nil, "expected an integer"},
		{"a fractional id", `{"token_ids":[1.5]}`, 100, nil, "expected an integer"},
		{"a string id", `{"token_ids":["1"]}`, 100, nil, "expected an integer"},
		{"more ids than allowed", `{"token_ids":[1,2,3]}`, 2, nil, "more than 2"},
		{"no token_ids", `{"request_id":"x"}`, 100, nil, "no token_ids"},
		{"empty token_ids", `{"token_ids":[]}`, 100, nil, "empty"},
		{"token_ids twice", `{"token_ids":[1],"token_ids":[2]}`, 100, nil, "twice"},
		{"token_ids not a list", `{"token_ids":{"0":1}}`, 100, nil, "want an array"},
		{"a list instead of an object", `[` + vllmChatReply + `]`, 100, nil, "want an object"},
		{"vLLM's error reply", `{"error":{"message":"boom","type":"BadRequestError","param":null,"code":400}}`, 100, nil, "no token_ids"},
		{"trailing garbage", vllmChatReply + `x`, 100, nil, "chat render reply"},
		{"truncated", vllmChatReply[:40], 100, nil, "chat render reply"},
		{"too deep", `{"x":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `,"token_ids":[1]}`, 100, nil, "deeper"},
		{"empty body", ``, 100, nil, "chat render reply"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseChatRender([]byte(tt.body), tt.max)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				assert.Nil(t, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// vllmResponsesReply is a /v1/responses/render reply as vLLM's ServingRender writes it
// (render_responses_request: the request's request_id, its transfer params and
// offsets), trimmed of most sampling parameters. A /v1/messages/render reply has the
// chat reply's shape.
const vllmResponsesReply = `{"request_id":"resp_6f0a","token_ids":[151644,872,198,13048],"features":null,` +
	`"sampling_params":{"n":1,"max_tokens":7},"model":"Qwen/Qwen3-8B","stream":false,"cache_salt":null,` +
	`"priority":0,"kv_transfer_params":null,"ec_transfer_params":null,"token_offsets":null}`

// TestParseResponsesAndMessagesRender: both replies are one GenerateRequest, read as a
// chat render's; their errors name their endpoint.
func TestParseResponsesAndMessagesRender(t *testing.T) {
	for _, tt := range []struct {
		api   string
		parse func([]byte, int) ([]uint32, error)
		reply string
		want  []uint32
	}{
		{"responses", ParseResponsesRender, vllmResponsesReply, []uint32{151644, 872, 198, 13048}},
		{"messages", ParseMessagesRender, vllmChatReply, []uint32{151644, 8948, 198, 2610}},
	} {
		t.Run(tt.api, func(t *testing.T) {
			got, err := tt.parse([]byte(tt.reply), 100)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			for _, bad := range []string{`[` + tt.reply + `]`, `{"token_ids":[]}`, `{"token_ids":[2147483648]}`, tt.reply + `x`, ``} {
				got, err := tt.parse([]byte(bad), 100)
				require.Error(t, err, bad)
				assert.Contains(t, err.Error(), tt.api+" render reply", bad)
				assert.Nil(t, got)
			}
			_, err = tt.parse([]byte(tt.reply), 3)
			assert.ErrorContains(t, err, "more than 3")
		})
	}
}

func TestParseCompletionsRender(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    []uint32
		wantErr string
	}{
		{"one prompt", `[` + vllmChatReply + `]`, []uint32{151644, 8948, 198, 2610}, ""},
		{"a batch is read by its first prompt", `[{"token_ids":[7,8]},{"token_ids":[9]}]`, []uint32{7, 8}, ""},
		{"later prompts are syntax-checked", `[{"token_ids":[7,8]},{"token_ids":[9}]`, nil, "completions render reply"},
		{"an empty list", `[]`, nil, "empty list"},
		{"an object instead of a list", vllmChatReply, nil, "want an array"},
		{"a first element without ids", `[{"model":"m"}]`, nil, "no token_ids"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCompletionsRender([]byte(tt.body), 100)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// FuzzParseRender: a render reply is outside input. Whatever the bytes, the parsers
// return an error or ids that are bounded in number and value, never panic.
func FuzzParseRender(f *testing.F) {
	f.Add([]byte(vllmChatReply), false)
	f.Add([]byte(`[`+vllmChatReply+`,{"token_ids":[3]}]`), true)
	f.Add([]byte(`{"token_ids":[2147483648]}`), false)
	f.Add([]byte(`{"token_ids":[1,2,3,4,5,6,7,8,9]}`), false)
	f.Add([]byte(`[[[[[[`), true)
	f.Add([]byte(vllmResponsesReply), false)
	f.Fuzz(func(t *testing.T, body []byte, completions bool) {
		const limit = 8
		parse := ParseChatRender
		if completions {
			parse = ParseCompletionsRender
		}
		ids, err := parse(body, limit)
		if err != nil {
			if ids != nil {
				t.Fatalf("ids %v with error %v", ids, err)
			}
			return
		}
		if len(ids) == 0 || len(ids) > limit {
			t.Fatalf("%d ids (limit %d)", len(ids), limit)
		}
		for _, id := range ids {
			if id > maxID {
				t.Fatalf("id %d above 2^31-1", id)
			}
		}
	})
}
