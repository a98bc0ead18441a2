package scoring_test

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/kvroute/kvroute/scoring"
)

// The founding case of DESIGN §3: a resumed session whose holder is a little busier.
func ExampleKVCost() {
	req := &scoring.Request{PromptTokens: 3008, BlockSize: 64, Blocks: make([]uint64, 47)}
	candidates := []scoring.Candidate{
		{Worker: "holder", Overlap: 46, ActiveBlocks: 143},
		{Worker: "cold", Overlap: 0, ActiveBlocks: 95},
	}
	for _, alpha := range []float64{0, 0.25} {
		params := scoring.DynamoParams()
		params.PrefixAffinityWeight = alpha
		picker, _ := scoring.NewKVCost(params, rand.New(rand.NewPCG(1, 1)))
		d, _ := picker.Pick(context.Background(), req, candidates)
		fmt.Printf("α=%.2f → %s (costs %.2f, %.2f; blocks lost %d)\n",
			alpha, d.Worker, d.Terms[0].Cost, d.Terms[1].Cost, d.BlocksLost)
	}
	// Output:
	// α=0.00 → cold (costs 144.00, 142.00; blocks lost 46)
	// α=0.25 → holder (costs 144.25, 153.75; blocks lost 0)
}
