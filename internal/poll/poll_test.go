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

func TestEachCallsEveryTargetOnceWithAtMostTheLimitInFlight(t *testing.T) {
	for _, tc := range []struct {
		name           string
		targets, limit int
	}{
		{"fewer targets than the limit", 2, 4},
		{"as many as the limit", 3, 3},
		{"more targets than the limit wait for a slot", 9, 2},
		{"no targets", 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			targets := make([]Target, tc.targets)
			for i := range targets {
				targets[i] = Target{Name: fmt.Sprint("w", i)}
			}
			var active, most atomic.Int32
			var started atomic.Int32
			release := make(chan struct{})
			seen := make(chan string, tc.targets)
			done := make(chan struct{})
			go func() {
				each(context.Background(), targets, tc.limit, func(_ context.Context, target Target) {
					now := active.Add(1)
					for {
						old := most.Load()
						if now <= old || most.CompareAndSwap(old, now) {
							break
						}
					}
					started.Add(1)
					<-release
					seen <- target.Name
					active.Add(-1)
				})
				close(done)
			}()
			// Let calls in one at a time: each waits until the slots are all taken
			// (or every target started), so calls over the limit would have started.
			for i := range tc.targets {
				require.Eventually(t, func() bool {
					return started.Load() >= int32(min(i+tc.limit, tc.targets))
				}, 10*time.Second, time.Millisecond)
				assert.LessOrEqual(t, active.Load(), int32(tc.limit))
				release <- struct{}{}
			}
			<-done
			close(seen)
			var names []string
			for name := range seen {
				names = append(names, name)
			}
			assert.ElementsMatch(t, targetNames(targets), names, "every target once")
			assert.LessOrEqual(t, most.Load(), int32(tc.limit), "never more calls in flight than the limit")
			if tc.targets > 0 {
				assert.Equal(t, int32(min(tc.limit, tc.targets)), most.Load(), "the slots are used")
			}
		})
	}
}

func targetNames(targets []Target) []string {
	names := make([]string, len(targets))
	for i, t := range targets {
		names[i] = t.Name
	}
	return names
}
