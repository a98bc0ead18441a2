package envoytest

import (
	"net"
	"net/url"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCloseIgnoresConnectionsThatSentNoRequest: a client's spare connection (opened,
// never used) is not a request in flight, so Close neither waits for it nor reports
// it stuck. http.Server.Shutdown counts such a connection as active for 5 s, which
// made Close fail under load.
func TestCloseIgnoresConnectionsThatSentNoRequest(t *testing.T) {
	addr := startProcessor(t, func(req *extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
		return []*extprocv3.ProcessingResponse{continueAll(req)}, nil
	})
	s := NewServer(Config{ProcessorAddress: addr, MessageTimeout: time.Minute})
	u, err := url.Parse(s.URL)
	require.NoError(t, err)
	spare, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	defer spare.Close()
	assert.NoError(t, s.Close())
}
