package poll

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/h2ctest"
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

// roundTripper is a client's transport that is not an *http.Transport.
type roundTripper struct{}

func (roundTripper) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New("unused")
}

// A target that speaks h2c is polled over HTTP/2 with prior knowledge, through one
// transport for every round (its connection kept), cloned from the client's own so its
// dialer and limits hold; any other target through the client as given.
func TestClientsSpeakEachTargetsProtocol(t *testing.T) {
	var mu sync.Mutex
	var protos []string
	conns := map[string]bool{} // remote addresses: one per connection
	srv := h2ctest.NewServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		protos = append(protos, r.Proto)
		conns[r.RemoteAddr] = true
	}))
	address := srv.Listener.Addr().String()
	h2c, http1 := Target{Name: "a", Address: address, H2C: true}, Target{Name: "a", Address: address}

	var dials atomic.Int32
	dialer := &net.Dialer{}
	own := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 4,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return dialer.DialContext(ctx, network, addr)
		}}}
	tests := []struct {
		name      string
		client    *http.Client
		wantDials int32 // by own's dialer, for the h2c rounds
	}{
		{"no client: http.DefaultTransport's settings", nil, 0},
		{"a client's transport is cloned: its dialer dials", own, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mu.Lock()
			protos, conns = nil, map[string]bool{}
			mu.Unlock()
			dials.Store(0)
			c := NewClients(tt.client)
			for range 3 {
				_, body, err := Get(context.Background(), c.For(h2c), "http://"+address+"/", time.Second, "")
				require.NoError(t, err)
				require.NoError(t, body.Close())
			}
			mu.Lock()
			assert.Equal(t, []string{"HTTP/2.0", "HTTP/2.0", "HTTP/2.0"}, protos)
			assert.Len(t, conns, 1, "one connection for every round")
			mu.Unlock()
			assert.Equal(t, tt.wantDials, dials.Load())

			_, _, err := Get(context.Background(), c.For(http1), "http://"+address+"/", time.Second, "")
			assert.Error(t, err, "an h2c-only engine refuses HTTP/1.1")
			if tt.client != nil {
				assert.Same(t, tt.client, c.For(http1), "the client as given")
				assert.Equal(t, tt.client.Timeout, c.For(h2c).Timeout, "a copy of it")
				assert.NotSame(t, tt.client.Transport, c.For(h2c).Transport, "over a clone of its transport")
				assert.Equal(t, 4, c.For(h2c).Transport.(*http.Transport).MaxConnsPerHost, "with its limits")
			}
		})
	}

	other := &http.Client{Transport: roundTripper{}}
	c := NewClients(other)
	assert.Same(t, other, c.For(h2c), "a round tripper not an *http.Transport speaks its own protocol to every target")
	assert.Same(t, other, c.For(http1))
}
