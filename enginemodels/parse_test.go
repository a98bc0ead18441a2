package enginemodels

import (
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/enginename"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		page    string
		want    map[string]string
		wantErr string
	}{
		{"vLLM with two adapters", `{"object":"list","data":[
			{"id":"Qwen/Qwen3-8B","object":"model","root":"/models/qwen3","parent":null,"max_model_len":32768},
			{"id":"sql","object":"model","root":"/loras/sql","parent":"Qwen/Qwen3-8B"},
			{"id":"chat","object":"model","root":"/loras/chat","parent":"Qwen/Qwen3-8B"}]}`,
			map[string]string{"sql": "Qwen/Qwen3-8B", "chat": "Qwen/Qwen3-8B"}, ""},
		{"base model only, no parent field", `{"data":[{"id":"m"}]}`, map[string]string{}, ""},
		{"empty list", `{"data":[]}`, map[string]string{}, ""},
		{"an adapter listed twice keeps its first parent", `{"data":[{"id":"a","parent":"m"},{"id":"a","parent":"n"}]}`, map[string]string{"a": "m"}, ""},
		{"not JSON", `<html>`, nil, "model list:"},
		{"no data", `{"object":"list"}`, nil, "no data array"},
		{"data not an array", `{"data":{"id":"a"}}`, nil, "model list:"},
		{"a card without an id", `{"data":[{"parent":"m"}]}`, nil, "data[0] has no id"},
		{"an empty id", `{"data":[{"id":""}]}`, nil, "data[0].id: empty"},
		{"an id with a line break", `{"data":[{"id":"a\nb","parent":"m"}]}`, nil, "control or format character U+000A"},
		{"a C1 control", `{"data":[{"id":"a\u0085b"}]}`, nil, "U+0085"},
		{"a bidi override", `{"data":[{"id":"sql","parent":"q\u202ewen"}]}`, nil, "U+202E"},
		{"a zero-width space", `{"data":[{"id":"s\u200bql","parent":"qwen"}]}`, nil, "U+200B"},
		{"data twice", `{"data":[],"data":[]}`, nil, "data twice"},
		{"data null", `{"data":null}`, nil, "model list:"},
		{"trailing data", `{"data":[]} {}`, nil, "data after the object"},
		{"unknown fields skipped, whatever they hold", `{"object":"list","extra":{"deep":[1,2,{"x":null}]},"data":[{"id":"m","created":1,"permission":[{}]}]}`, map[string]string{}, ""},
		{"an empty parent", `{"data":[{"id":"a","parent":""}]}`, nil, "data[0].parent: empty"},
		{"its own parent", `{"data":[{"id":"a","parent":"a"}]}`, nil, "names itself"},
		{"an oversized name", `{"data":[{"id":"` + strings.Repeat("x", enginename.MaxBytes+1) + `"}]}`, nil, "more than 512"},
		{"an id that is a number", `{"data":[{"id":7}]}`, nil, "model list:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.page))
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got.Adapters)
		})
	}
}

// TestParseRefusesMoreThanMaxModels: a page's cards size what kvroute keeps, so a list
// longer than any engine's is refused whole, not cut.
func TestParseRefusesMoreThanMaxModels(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"data":[`)
	for i := range MaxModels + 1 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"id":"m"}`)
	}
	b.WriteString(`]}`)
	_, err := Parse([]byte(b.String()))
	require.ErrorIs(t, err, ErrBadList)
	require.ErrorContains(t, err, "more than 10000 cards")
}

// TestParseHoldsNoMoreThanItKeeps: a page of a million empty cards (3 MiB, under the 4 MiB a
// read takes) is refused after MaxModels of them; decoding it whole first allocated
// 131 MiB (helper-32's review).
func TestParseHoldsNoMoreThanItKeeps(t *testing.T) {
	page := []byte(`{"data":[` + strings.Repeat(`{},`, 1<<20) + `{}]}`)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := Parse(page)
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, ErrBadList)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(16<<20), "bytes allocated")
}

func TestParseListsBaseModels(t *testing.T) {
	list, err := Parse([]byte(`{"data":[{"id":"qwen","parent":null},{"id":"sql","parent":"qwen"},{"id":"llama"},{"id":"qwen"}]}`))
	require.NoError(t, err)
	assert.Equal(t, map[string]struct{}{"qwen": {}, "llama": {}}, list.Bases)
}

// TestParseContextLengths: a card's max_model_len is its engine's context (vLLM's
// --max-model-len); only an integer an engine would send is taken, anything else
// leaves the card without one and the list as it is.
func TestParseContextLengths(t *testing.T) {
	tests := []struct {
		name string
		card string
		want map[string]int
	}{
		{"vLLM's base card", `{"id":"m","parent":null,"max_model_len":32768}`, map[string]int{"m": 32768}},
		{"an adapter's card", `{"id":"a","parent":"m","max_model_len":4096}`, map[string]int{"a": 4096}},
		{"absent", `{"id":"m"}`, map[string]int{}},
		{"null", `{"id":"m","max_model_len":null}`, map[string]int{}},
		{"the largest kept", `{"id":"m","max_model_len":2147483647}`, map[string]int{"m": MaxContextLength}},
		{"past the bound", `{"id":"m","max_model_len":2147483648}`, map[string]int{}},
		{"past int64", `{"id":"m","max_model_len":99999999999999999999999}`, map[string]int{}},
		{"zero", `{"id":"m","max_model_len":0}`, map[string]int{}},
		{"negative", `{"id":"m","max_model_len":-1}`, map[string]int{}},
		{"a fraction", `{"id":"m","max_model_len":1.5}`, map[string]int{}},
		{"an integer written as a float", `{"id":"m","max_model_len":4096.0}`, map[string]int{}},
		{"an exponent", `{"id":"m","max_model_len":4e3}`, map[string]int{}},
		{"a string", `{"id":"m","max_model_len":"4096"}`, map[string]int{}},
		{"an object", `{"id":"m","max_model_len":{"n":4096}}`, map[string]int{}},
		{"a card listed twice keeps its first", `{"id":"m","max_model_len":1024},{"id":"m","max_model_len":2048}`, map[string]int{"m": 1024}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			list, err := Parse([]byte(`{"data":[` + tt.card + `]}`))
			require.NoError(t, err)
			assert.Equal(t, tt.want, list.ContextLengths)
			assert.Equal(t, 1, len(list.Bases)+len(list.Adapters), "the card is listed whatever its length")
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add(`{"object":"list","data":[{"id":"m","parent":null},{"id":"sql","parent":"m"}]}`)
	f.Add(`{"data":[{"id":"a","parent":"a"}]}`)
	f.Add(`{"data":null}`)
	f.Add(`{"data":[{"id":"\u0000"}]}`)
	f.Add(`{"data":[{"id":"m","max_model_len":32768},{"id":"a","parent":"m","max_model_len":-0}]}`)
	f.Fuzz(func(t *testing.T, page string) {
		list, err := Parse([]byte(page))
		if err != nil {
			if list.Adapters != nil {
				t.Fatalf("error %v with a list", err)
			}
			return
		}
		if len(list.Adapters) > MaxModels {
			t.Fatalf("%d adapters, more than %d", len(list.Adapters), MaxModels)
		}
		for base := range list.Bases {
			if enginename.Check(base) != nil {
				t.Fatalf("kept base %q", base)
			}
		}
		for adapter, base := range list.Adapters {
			if enginename.Check(adapter) != nil || enginename.Check(base) != nil || adapter == base {
				t.Fatalf("kept %q → %q", adapter, base)
			}
		}
		for name, n := range list.ContextLengths {
			_, base := list.Bases[name]
			_, adapter := list.Adapters[name]
			if n < 1 || n > MaxContextLength || !(base || adapter) {
				t.Fatalf("kept context length %d of %q", n, name)
			}
		}
	})
}
