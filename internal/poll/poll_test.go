package poll

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEveryCallsAtOnceThenEachIntervalUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int32
	done := make(chan struct{})
	go func() {
		Every(ctx, time.Millisecond, func(context.Context) { calls.Add(1) })
		close(done)
	}()
	require.Eventually(t, func() bool { return calls.Load() >= 3 }, 10*time.Second, time.Millisecond)
	cancel()
	<-done // Every returns once cancelled

	var once atomic.Int32
	cancelled, stop := context.WithCancel(context.Background())
	stop()
	Every(cancelled, time.Hour, func(context.Context) { once.Add(1) })
	assert.Equal(t, int32(1), once.Load(), "the first call happens at once, even when already cancelled")
}

func TestGetPassesOnlyA200AndCarriesAccept(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			w.Header().Set("X-Accept-Seen", r.Header.Get("Accept"))
			fmt.Fprint(w, "fine")
		case "/slow":
			<-r.Context().Done()
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	ctx := context.Background()

	header, body, err := Get(ctx, srv.Client(), srv.URL+"/ok", time.Second, "text/plain")
	require.NoError(t, err)
	got, err := io.ReadAll(body)
	require.NoError(t, err)
	require.NoError(t, body.Close())
	assert.Equal(t, "fine", string(got))
	assert.Equal(t, "text/plain", header.Get("X-Accept-Seen"))

	_, _, err = Get(ctx, srv.Client(), srv.URL+"/down", time.Second, "")
	assert.ErrorContains(t, err, "status 503")
	_, _, err = Get(ctx, srv.Client(), srv.URL+"/slow", 10*time.Millisecond, "")
	assert.ErrorIs(t, err, context.DeadlineExceeded, "the timeout bounds the request")
}
