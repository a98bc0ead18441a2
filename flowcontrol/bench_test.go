package flowcontrol

import (
	"context"
	"testing"

	"github.com/kvroute/kvroute/router"
)

// takesAll is a router that routes every request at once: flow control holds nothing.
type takesAll struct{ d router.Decision }

func (r *takesAll) Route(context.Context, *router.Request) (*router.Decision, error) {
	return &r.d, nil
}

func (*takesAll) Priority(*router.Request) int { return 0 }

func (*takesAll) HasRoom(string) bool { return true }

func (*takesAll) StillWaits(*router.HolderBusyError) bool { return true }

type fixedLedger struct{}

func (fixedLedger) Version() uint64 { return 0 }

// BenchmarkRouteNothingHeld is what flow control adds to a request no worker refuses
// (the common case): off, a call through; on, its lock and its model's queue looked up
// (none) before the router decides. parallel: every P routes at once, as the filter's
// streams do, so the lock is contended.
func BenchmarkRouteNothingHeld(b *testing.B) {
	for _, enabled := range []bool{false, true} {
		name := "off"
		if enabled {
			name = "on"
		}
		cfg := DefaultConfig()
		cfg.Enabled = enabled
		q, err := New(cfg, Deps{Router: &takesAll{}, Ledger: fixedLedger{}})
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		b.Run(name, func(b *testing.B) {
			req := &router.Request{Model: "m", FairnessID: "a"}
			for b.Loop() {
				if _, err := q.Route(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/parallel", func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				req := &router.Request{Model: "m", FairnessID: "a"}
				for pb.Next() {
					if _, err := q.Route(ctx, req); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
