package router

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/scoring"
)

// panicky is a collaborator the router calls under its decision lock that panics on
// its first call: before the booking (the session lookup) or after it (the record sink).
type panicky struct{ fired atomic.Bool }

func (p *panicky) fire() {
	if !p.fired.Swap(true) {
		panic("injected fault")
	}
}

func (p *panicky) Lookup(string) (string, bool)              { p.fire(); return "", false }
func (p *panicky) Remember(string, string)                   {}
func (p *panicky) ForgetWorker(string) int                   { return 0 }
func (p *panicky) Recorded(string, string, []uint64, string) { p.fire() }

// TestAPanicUnderTheDecisionLockFailsOneDecision: a collaborator that panics inside
// the decision (server.Recovery turns the panic into that one stream's error) leaves
// the router serving: the lock is free for the next decision, and what the failed
// decision had booked is released.
func TestAPanicUnderTheDecisionLockFailsOneDecision(t *testing.T) {
	for _, where := range []string{"before the booking", "after the booking"} {
		t.Run(where, func(t *testing.T) {
			f := newFixture(t, scoring.DynamoParams(), twoWorkers()...)
			fault := &panicky{}
			if where == "before the booking" {
				f.router.deps.Sessions = fault
			} else {
				f.router.deps.Records = fault
			}
			req := &Request{Model: "m", Tokens: tokens(0, 40), Session: "s"}
			assert.Panics(t, func() { _, _ = f.router.Route(context.Background(), req) })

			done := make(chan error, 1)
			go func() {
				d, err := f.router.Route(context.Background(), req)
				if err == nil {
					d.Release()
				}
				done <- err
			}()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("the next decision never got the decision lock")
			}
			for _, w := range twoWorkers() {
				assert.Equal(t, scoring.Load{}, f.bookings.Load(w.Name), "%s: the failed decision's booking was released", w.Name)
			}
		})
	}
}
