package filter_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/router"
)

type ctxProbe struct {
	filter.Router
	entered, gate chan struct{}
	err           chan error
}

func (s ctxProbe) Route(ctx context.Context, req *router.Request) (*router.Decision, error) {
	s.entered <- struct{}{}
	<-s.gate
	s.err <- ctx.Err()
	return s.Router.Route(ctx, req)
}

func TestH71TheLateDecisionsStreamIsAlreadyCancelled(t *testing.T) {
	probe := ctxProbe{entered: make(chan struct{}, 1), gate: make(chan struct{}), err: make(chan error, 1)}
	p := newPlane(t, planeOptions{
		wrapRouter: func(r filter.Router) filter.Router { probe.Router = r; return probe },
		envoyCfg:   func(c *envoytest.Config) { c.MessageTimeout = time.Second },
	})
	done := make(chan struct{})
	go func() {
		resp, err := p.envoy.Client().Post(p.envoy.URL+"/v1/chat/completions", "application/json", strings.NewReader(chat("late", false)))
		if err == nil {
			resp.Body.Close()
		}
		close(done)
	}()
	<-probe.entered
	<-done
	time.Sleep(100 * time.Millisecond)
	probe.gate <- struct{}{}
	require.ErrorIs(t, <-probe.err, context.Canceled, "Route could tell the stream is gone")
}
