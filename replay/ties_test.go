package replay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/sim"
)

// fixedArrivals is an open-loop workload of given arrivals.
type fixedArrivals []Arrival

func (f fixedArrivals) Start() []Arrival                        { return f }
func (f fixedArrivals) Completed(*Req, time.Duration) []Arrival { return nil }

func TestRequestsArrivingAtOneInstantShareTheFirstPass(t *testing.T) {
	// Two requests reach an idle worker at the same virtual instant (the synthetic
	// Mooncake trace has such pairs): the engine's next pass starts after both have
	// arrived, as a real engine's step would see both, so they share it and get their
	// first tokens together.
	req := func(id int, seed uint32) *Req {
		r := &Req{ID: id, Session: -1}
		for i := range 200 {
			r.Prompt = append(r.Prompt, seed*1000+uint32(i))
		}
		r.Output = []uint32{1, 2}
		return r
	}
	w := fixedArrivals{{At: time.Second, Req: req(0, 1)}, {At: time.Second, Req: req(1, 2)}}
	cfg := Config{Workers: 1, Engine: sim.Config{NumGPUBlocks: 512, BlockSize: 64, MaxNumSeqs: 8, MaxBatchedTokens: 8192},
		Policy: "round_robin", Seed: 1, IndexSource: SourceApproximate, Model: "m"}
	res, err := Run(cfg, w)
	require.NoError(t, err)
	assert.Equal(t, res.TTFTP50ms, res.TTFTP95ms, "both first tokens come from one pass")
}
