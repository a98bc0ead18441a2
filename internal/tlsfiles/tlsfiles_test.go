package tlsfiles

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAFileReplacedWithTheSameSizeAndTimeIsReloaded: a certificate renamed into place
// (a Kubernetes secret volume's symlink swap, cert-manager's rotation) with the old
// file's size and modification time is still a change.
func TestAFileReplacedWithTheSameSizeAndTimeIsReloaded(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tls.crt")
	require.NoError(t, os.WriteFile(path, []byte("first"), 0o600))
	fi, err := os.Stat(path)
	require.NoError(t, err)
	build := func() (*tls.Config, error) {
		raw, err := os.ReadFile(path)
		return &tls.Config{ServerName: string(raw)}, err
	}
	r, err := New("tls", []string{path}, build, nil)
	require.NoError(t, err)
	require.Equal(t, "first", r.Current().ServerName)

	next := filepath.Join(dir, "tls.crt.new")
	require.NoError(t, os.WriteFile(next, []byte("other"), 0o600)) // the same size
	require.NoError(t, os.Chtimes(next, time.Time{}, fi.ModTime()))
	require.NoError(t, os.Rename(next, path))
	after, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, fi.Size(), after.Size())
	require.True(t, fi.ModTime().Equal(after.ModTime()), "the same modification time")
	assert.Equal(t, "other", r.Current().ServerName)
}
