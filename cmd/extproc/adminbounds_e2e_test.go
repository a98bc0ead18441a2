package main

import (
	"bufio"
	"net/http"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/config"
)

// Watch streams of /peers/load held open by other replicas do not hold the shutdown:
// they end as the admin port shuts down, which is right after the streams' grace.
func TestOpenWatchStreamsDoNotDelayTheShutdown(t *testing.T) {
	// A grace far past what a shutdown takes on a loaded machine: a shutdown that
	// waited for the streams would take all of it (and its second more), one that did
	// not is well under it whatever the load.
	const grace = 30 * time.Second
	d := deploy(t, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED, func(c *config.Config) {
		c.ShutdownGrace = grace
	})
	ended := make(chan error, 8)
	for range 8 {
		resp, err := http.Get(d.adminURL + "/peers/load?watch")
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		lines := bufio.NewScanner(resp.Body)
		require.True(t, lines.Scan(), "the first report")
		go func() {
			for lines.Scan() {
			}
			ended <- lines.Err()
		}()
	}
	start := time.Now()
	d.stop()
	took := time.Since(start)
	assert.Less(t, took, grace, "no stream in flight on the ext_proc port: the shutdown does not wait out the grace for the watches")
	for range 8 {
		select {
		case err := <-ended:
			assert.NoError(t, err, "the stream ends cleanly")
		case <-time.After(5 * time.Second):
			t.Fatal("a watch stream is still open after the shutdown")
		}
	}
}
