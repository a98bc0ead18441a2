package config

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFlagsReplaceTheFilesValuesBeforeTheyAreJudged: a flag that overrides a key
// replaces the file's value before validation, so a bad value it replaces is not
// refused; without the flag it still is, by name.
func TestFlagsReplaceTheFilesValuesBeforeTheyAreJudged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvroute.yaml")
	require.NoError(t, os.WriteFile(path, []byte(minimal+"log_level: loud\nadmin_address: \"\"\n"), 0o600))
	tests := []struct {
		name    string
		flags   Overrides
		wantErr string
	}{
		{"both bad values replaced", Overrides{LogLevel: "info", AdminAddress: "127.0.0.1:9191"}, ""},
		{"the bad level kept", Overrides{AdminAddress: "127.0.0.1:9191"}, "log_level"},
		{"the empty address kept", Overrides{LogLevel: "info"}, "admin_address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := LoadWith(path, tt.flags)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, "info", cfg.LogLevel)
			assert.Equal(t, "127.0.0.1:9191", cfg.AdminAddress)
		})
	}
}
