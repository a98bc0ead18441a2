package secret

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReadFileTrimsAndRefusesWhatNoHeaderCarries(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	tests := []struct {
		name, path, want, err string
	}{
		{"a final newline", file("ok", "sk-abc\n"), "sk-abc", ""},
		{"surrounding spaces", file("spaced", "  sk-abc \t\n"), "sk-abc", ""},
		{"a missing file", filepath.Join(dir, "missing"), "", "open " + filepath.Join(dir, "missing")},
		{"an empty file", file("empty", " \n"), "", filepath.Join(dir, "empty") + " is empty"},
		{"a file too large", file("large", strings.Repeat("s", MaxFileBytes+1)), "", "is larger than 4096 bytes"},
		{"a NUL", file("nul", "secret\x00key"), "", "control character"},
		{"two lines", file("lines", "secret\nkey\n"), "", "control character"},
		{"DEL", file("del", "secret\x7f"), "", "control character"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ReadFile(tt.path)
			if tt.err == "" {
				require.NoError(t, err)
				assert.Equal(t, tt.want, got)
				return
			}
			require.ErrorContains(t, err, tt.err)
			assert.NotContains(t, err.Error(), "secret\x00", "the content is never quoted")
		})
	}
}
