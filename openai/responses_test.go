package openai

import (
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseResponsesReadsTheRoutingFields(t *testing.T) {
	longest := strings.Repeat("r", MaxResponseIDBytes)
	tests := []struct {
		name string
		body string
		want ResponsesRequest
	}{
		{"defaults: store on, the rest off",
			`{"model":"m","input":"hi"}`,
			ResponsesRequest{Model: "m", Store: true}},
		{"a follow-up",
			`{"model":"m","input":[{"role":"user","content":"more"}],"previous_response_id":"resp_1"}`,
			ResponsesRequest{Model: "m", PreviousResponseID: "resp_1", Store: true}},
		{"every field given",
			`{"stream":true,"background":true,"store":false,"previous_response_id":"resp_2","model":"m"}`,
			ResponsesRequest{Model: "m", PreviousResponseID: "resp_2", Background: true, Stream: true}},
		{"null is absent",
			`{"model":"m","previous_response_id":null,"store":null,"background":null,"stream":null}`,
			ResponsesRequest{Model: "m", Store: true}},
		{"booleans as the engines read them",
			`{"model":"m","store":"no","background":1,"stream":"yes"}`,
			ResponsesRequest{Model: "m", Background: true, Stream: true}},
		{"an escaped id is read unescaped",
			`{"model":"m","previous_response_id":"resp_\u00e9\/x"}`,
			ResponsesRequest{Model: "m", PreviousResponseID: "resp_é/x", Store: true}},
		{"an id of MaxResponseIDBytes",
			`{"model":"m","previous_response_id":"` + longest + `"}`,
			ResponsesRequest{Model: "m", PreviousResponseID: longest, Store: true}},
		{"a later duplicate field wins",
			`{"model":1,"previous_response_id":7,"store":"x","model":"m","previous_response_id":"resp_3","store":false}`,
			ResponsesRequest{Model: "m", PreviousResponseID: "resp_3"}},
		// Ids a client chose (vLLM takes the request's request_id as the response's): the
		// engine judges them; kvroute pins none.
		{"an empty previous id: not pinned",
			`{"model":"m","previous_response_id":""}`,
			ResponsesRequest{Model: "m", Store: true}},
		{"a previous id longer than MaxResponseIDBytes: not pinned",
			`{"model":"m","previous_response_id":"` + longest + `r"}`,
			ResponsesRequest{Model: "m", Store: true}},
		{"a later empty previous id overrides a good one",
			`{"model":"m","previous_response_id":"resp_1","previous_response_id":""}`,
			ResponsesRequest{Model: "m", Store: true}},
		{"a cache salt",
			`{"model":"m","cache_salt":"tenant-a"}`,
			ResponsesRequest{Model: "m", Store: true, CacheSalt: "tenant-a"}},
		{"a later null overrides an earlier id",
			`{"model":"m","previous_response_id":"resp_1","previous_response_id":null}`,
			ResponsesRequest{Model: "m", Store: true}},
		{"other fields are skipped whatever they hold",
			`{"model":"m","input":[{"type":"message","content":[{"type":"input_text","text":"x"}]}],"tools":[{"type":"function","name":"f","parameters":{}}],"instructions":"be brief","metadata":{"previous_response_id":9,"store":"bad"},"max_output_tokens":-5}`,
			ResponsesRequest{Model: "m", Store: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseResponses([]byte(tt.body), DefaultLimits())
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestParseResponsesRejects(t *testing.T) {
	deep := `{"model":"m","input":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}`
	tests := []struct {
		name  string
		body  string
		param string
		msg   string
	}{
		{"empty body", ``, "", "request body is empty"},
		{"not JSON", `{"model":`, "", "not valid JSON"},
		{"not an object", `["m"]`, "", "must be a JSON object"},
		{"trailing data", `{"model":"m"} x`, "", "not valid JSON"},
		{"a syntax error in a skipped field", `{"model":"m","input":[1,}`, "", "not valid JSON"},
		{"nested deeper than the limit", deep, "", "deeper than 128 levels (max_json_depth)"},
		{"no model", `{"input":"x"}`, "model", "'model' is required"},
		{"an empty model", `{"model":""}`, "model", "'model' is required"},
		{"a model that is no string", `{"model":["m"]}`, "model", "'model' is required"},
		{"a previous id that is a number", `{"model":"m","previous_response_id":1}`, "previous_response_id", "string or null"},
		{"a previous id that is an object", `{"model":"m","previous_response_id":{"id":"resp_1"}}`, "previous_response_id", "string or null"},
		{"a previous id that is an empty array", `{"model":"m","previous_response_id":[]}`, "previous_response_id", "string or null"},
		{"store not a bool", `{"model":"m","store":2}`, "store", "'store' must be a boolean"},
		{"cache_salt not a string", `{"model":"m","cache_salt":7}`, "cache_salt", "'cache_salt' must be a string"},
		{"background not a bool", `{"model":"m","background":"maybe"}`, "background", "'background' must be a boolean"},
		{"stream not a bool", `{"model":"m","stream":[true]}`, "stream", "'stream' must be a boolean"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseResponses([]byte(tt.body), DefaultLimits())
			var fe *FieldError
			require.ErrorAs(t, err, &fe)
			require.ErrorIs(t, err, ErrBadRequest)
			assert.Equal(t, tt.param, fe.Param)
			assert.Contains(t, fe.Msg, tt.msg)
		})
	}
}

// TestParseResponsesAgreesWithParseOnTheBody pins that a /v1/responses body is judged
// as a whole, and for its model, exactly as Parse and ParseModel judge one.
func TestParseResponsesAgreesWithParseOnTheBody(t *testing.T) {
	lim := Limits{MaxDepth: 4, MaxPromptTokens: 8}
	for _, body := range []string{``, ` `, `null`, `[]`, `{`, `{"model":"m"`, `{"model":"m"}}`, `{"model":"\ud800"}`,
		`{"model":"m","x":[[[[1]]]]}`, `{"x":1}`, `{"model":null}`, `{"model":{"a":1}}`, "{\"model\":\"\xff\"}"} {
		_, err := ParseResponses([]byte(body), lim)
		_, want := ParseModel([]byte(body), lim)
		if want == nil {
			require.NoError(t, err, body)
			continue
		}
		require.Error(t, err, body)
		assert.Equal(t, want.Error(), err.Error(), body)
	}
}

// TestParseResponsesDoesNotMaterialiseSkippedValues pins that ParseResponses' memory
// does not grow with the fields it skips, nor with an array or object given to a field
// it reads: a 4 MiB body of tiny values allocates next to nothing.
func TestParseResponsesDoesNotMaterialiseSkippedValues(t *testing.T) {
	values := tinyValues(4<<20, "{}")
	tests := []struct {
		name string
		body string
	}{
		{"a huge input", `{"model":"m","input":[` + values + `],"previous_response_id":"resp_1"}`},
		{"a huge array given as the model", `{"model":[` + values + `]}`},
		{"a huge array given as the previous id", `{"model":"m","previous_response_id":[` + values + `]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := []byte(tt.body)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			_, _ = ParseResponses(body, DefaultLimits())
			runtime.ReadMemStats(&after)
			assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<10))
		})
	}
}
