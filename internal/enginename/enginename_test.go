package enginename

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestCheck(t *testing.T) {
	tests := []struct {
		name, in, wantErr string
	}{
		{"a model id", "Qwen/Qwen3-8B", ""},
		{"non-ASCII letters", "modèle-日本", ""},
		{"empty", "", "empty"},
		{"over the bound", strings.Repeat("x", MaxBytes+1), "513 bytes, more than 512"},
		{"at the bound", strings.Repeat("x", MaxBytes), ""},
		{"not UTF-8", "a\xffb", "not UTF-8"},
		{"a line break", "a\nb", "U+000A"},
		{"a C1 control", "a\u0085b", "U+0085"},
		{"a bidi override", "s\u202eql", "U+202E"},
		{"a zero-width space", "s\u200bql", "U+200B"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Check(tt.in)
			if tt.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
}
