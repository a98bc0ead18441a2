// Package poll is the periodic HTTP polling of workers that health probes and metrics
// scrapes share: a loop until cancelled, and a GET with a timeout that only a 200 passes.
package poll

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// Every calls f at once and then every interval until ctx is done; it returns after
// the last call. A call that outlasts the interval delays the next one rather than
// overlapping it.
func Every(ctx context.Context, interval time.Duration, f func(context.Context)) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		f(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Get GETs url within timeout and returns the headers and body of a 200 OK answer; any
// other status is an error. The caller closes the body, which also ends the timeout's
// context. accept, when set, is sent as the Accept header.
func Get(ctx context.Context, client *http.Client, url string, timeout time.Duration, accept string) (http.Header, io.ReadCloser, error) {
	return GetWith(ctx, client, url, timeout, func(req *http.Request) {
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
	})
}

// GetWith is Get with the request's headers set by header (an Accept, a credential).
func GetWith(ctx context.Context, client *http.Client, url string, timeout time.Duration, header func(*http.Request)) (http.Header, io.ReadCloser, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	header(req)
	resp, err := client.Do(req)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		cancel()
		return nil, nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	return resp.Header, body{resp.Body, cancel}, nil
}

// body closes the response body, then releases the request's timeout.
type body struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b body) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// Target is a worker to poll: its name, the ip:port its endpoints are on, and whether
// its engine speaks HTTP/2 over cleartext (h2c, with prior knowledge) rather than
// HTTP/1.1: an InferencePool's appProtocol kubernetes.io/h2c, which such an engine may
// be served with alone, refusing HTTP/1.1.
type Target struct {
	Name, Address string
	H2C           bool
}

// Clients are a poller's HTTP clients: one for targets that speak HTTP/1.1, one for
// targets that speak h2c. Each keeps its connections for every round, so a target is
// polled over connections kept alive, not a new one per request.
type Clients struct {
	http1, h2c *http.Client
}

// NewClients returns the clients of a poller that sends through client (nil: a new
// http.Client, on http.DefaultTransport). The h2c client is a copy of client over a
// clone of its transport (http.DefaultTransport when it has none) that speaks
// unencrypted HTTP/2 alone: the same dial and idle limits and timeouts, and
// prior knowledge instead of HTTP/1.1, which an h2c-only engine refuses. A client
// whose transport is not an *http.Transport (a test's round tripper) is used for
// both: its protocol is its own.
func NewClients(client *http.Client) Clients {
	if client == nil {
		client = &http.Client{}
	}
	base := client.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	t, ok := base.(*http.Transport)
	if !ok {
		return Clients{http1: client, h2c: client}
	}
	t = t.Clone()
	var p http.Protocols
	p.SetUnencryptedHTTP2(true) // and not HTTP1: a transport with both dials HTTP/1.1
	t.Protocols = &p
	h2c := *client
	h2c.Transport = t
	return Clients{http1: client, h2c: &h2c}
}

// For returns the client to poll target with.
func (c Clients) For(target Target) *http.Client {
	if target.H2C {
		return c.h2c
	}
	return c.http1
}

// MaxInFlight bounds the requests one round of a poller has open at once. Health
// probes, metrics scrapes and model lists each poll every worker: unbounded, a fleet
// of hundreds would open three sockets per worker at each interval, and a process
// under the common limit of 1,024 open files would then refuse its own ext_proc
// connections. 64 keeps a round of a few hundred healthy workers within one timeout
// or two; a round over many unresponsive workers takes a timeout per 64 of them.
const MaxInFlight = 64

// Each calls f once for every target, at most MaxInFlight at a time, and returns when
// every call has. The calls share ctx.
func Each(ctx context.Context, targets []Target, f func(context.Context, Target)) {
	each(ctx, targets, MaxInFlight, f)
}

func each(ctx context.Context, targets []Target, limit int, f func(context.Context, Target)) {
	slots := make(chan struct{}, limit)
	var wg sync.WaitGroup
	for _, t := range targets {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			f(ctx, t)
		})
	}
	wg.Wait()
}
