package template

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/openai"
)

// h74: tojson(indent=4) amplification. A tools entry whose parameters are arrays
// nested to max_json_depth, holding many small leaves, makes the Llama 3.1 template
// print every leaf on its own line indented ~500 spaces: the rendered prompt is
// ~250x the body. MaxOutputBytes (16 MiB) is checked only after the library has built
// the whole prompt, so the allocation is not bounded by it.
func deepToolsBody(leaves int) []byte {
	const k = 124 // 4 levels above parameters: object, tools, tool, function
	var b strings.Builder
	b.WriteString(`{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":`)
	b.WriteString(strings.Repeat("[", k))
	for i := range leaves {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('0')
	}
	b.WriteString(strings.Repeat("]", k))
	b.WriteString(`}}]}`)
	return []byte(b.String())
}

func TestH74RenderAllocationIsBoundedByMaxOutput(t *testing.T) {
	r, err := New(ollamaTemplate(t, llama31Model), llama3Tokens, Options{Now: func() time.Time { return llama3Clock }})
	require.NoError(t, err)
	body := deepToolsBody(128 << 10) // a 256 KiB body, 1/16 of the default max_body_bytes
	req, err := openai.Parse(openai.ChatCompletions, body, openai.DefaultLimits())
	require.NoError(t, err)

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err = r.Render(req.Chat)
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("body %d bytes, render error %v, allocated %d MiB", len(body), err, alloc>>20)
	require.True(t, errors.Is(err, ErrOutputTooLarge), "want ErrOutputTooLarge, got %v", err)
	// The cap is 16 MiB; building and then refusing a prompt should not cost many
	// times that. A 4 MiB body (the default max_body_bytes) would be 16x this one.
	require.Less(t, alloc, uint64(4*DefaultMaxOutputBytes), fmt.Sprintf("a %d-byte body made the renderer allocate %d MiB before it refused the prompt", len(body), alloc>>20))
}
