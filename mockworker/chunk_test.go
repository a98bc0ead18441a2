package mockworker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mapChunk is how the event used to be written: maps through encoding/json. The
// hand-written encoder must say the same.
func mapChunk(id, object, model string, created int64, chat bool, text string, finished bool) []byte {
	var finishReason any
	if finished {
		finishReason = "length"
	}
	choice := map[string]any{"index": 0, "finish_reason": finishReason}
	if chat {
		choice["delta"] = map[string]any{"role": "assistant", "content": text}
		object += ".chunk"
	} else {
		choice["text"] = text
	}
	b, _ := json.Marshal(map[string]any{"id": id, "object": object, "created": created, "model": model, "choices": []any{choice}})
	return fmt.Appendf(nil, "data: %s\n\n", b)
}

func TestChunkEventSaysWhatEncodingJSONSays(t *testing.T) {
	tests := []struct {
		name     string
		chat     bool
		text     string
		finished bool
	}{
		{"chat token", true, " the", false},
		{"last chat token", true, " end", true},
		{"completions token", false, " and", false},
		{"text needing escapes", true, "a \"quote\", a \\ and\n é 😀 <tag>", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := chunkEvent("cmpl-w0-7", "chat.completion", "mock", 1700000000, tt.chat, tt.text, tt.finished)
			want := mapChunk("cmpl-w0-7", "chat.completion", "mock", 1700000000, tt.chat, tt.text, tt.finished)
			require.True(t, bytes.HasPrefix(got, []byte("data: ")) && bytes.HasSuffix(got, []byte("\n\n")), "%q", got)
			var g, w any
			require.NoError(t, json.Unmarshal(bytes.TrimSpace(got[len("data: "):]), &g), "%s", got)
			require.NoError(t, json.Unmarshal(bytes.TrimSpace(want[len("data: "):]), &w))
			assert.Equal(t, w, g)
		})
	}
}

// BenchmarkChunkEvent compares the per-token event's two encodings.
func BenchmarkChunkEvent(b *testing.B) {
	for _, enc := range []struct {
		name string
		fn   func(string, string, string, int64, bool, string, bool) []byte
	}{{"maps", mapChunk}, {"appended", chunkEvent}} {
		b.Run(enc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				enc.fn("cmpl-w0-7", "chat.completion", "mock", 1700000000, true, " the", false)
			}
		})
	}
}
