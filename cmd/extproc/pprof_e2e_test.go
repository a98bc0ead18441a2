package main

import (
	"io"
	"net/http"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
)

// TestAdminPprofIsOptIn pins admin_pprof through the real wiring: off by default
// (404), and with the key set the admin port serves the index, a heap profile and a
// short CPU profile.
func TestAdminPprofIsOptIn(t *testing.T) {
	get := func(t *testing.T, url string) (int, []byte) {
		t.Helper()
		resp, err := http.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, body
	}
	tests := []struct {
		name string
		on   bool
		want int
	}{
		{"off by default", false, http.StatusNotFound},
		{"admin_pprof: true", true, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := deploy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED,
				func(c *config.Config) { c.AdminPprof = tt.on })
			defer d.stop()
			for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap?debug=1", "/debug/pprof/profile?seconds=1"} {
				code, body := get(t, d.adminURL+path)
				assert.Equal(t, tt.want, code, path)
				if tt.on {
					assert.NotEmpty(t, body, path)
				}
			}
			if tt.on {
				_, heap := get(t, d.adminURL+"/debug/pprof/heap?debug=1")
				assert.Contains(t, string(heap), "heap profile:")
			}
		})
	}
}

func TestAdminPprofParsesFromYAML(t *testing.T) {
	cfg, err := config.Parse([]byte("admin_pprof: true\nworkers: [{name: w0, address: \"127.0.0.1:8000\"}]\n"))
	require.NoError(t, err)
	assert.True(t, cfg.AdminPprof)
	assert.False(t, config.Default().AdminPprof)
	assert.Contains(t, config.RestartKeys(config.Default(), cfg), "admin_pprof")
}
