package index_test

import (
	"fmt"

	"github.com/kvroute/kvroute/index"
)

func ExampleIndex_Overlaps() {
	x, _ := index.New(index.Config{CapacityBlocks: 1024}, nil)
	_ = x.SetWorker("a", 0)
	_ = x.SetWorker("b", 0)

	tokens := make([]uint32, 200) // 3 full blocks of 64 and a partial one
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	blocks := index.BlockHashes(nil, tokens, 64, index.Salt("my-model", "", ""))
	_ = x.Store("a", blocks)     // a served the whole prompt
	_ = x.Store("b", blocks[:1]) // b holds only the first block

	ov := make([]int, 2)
	x.Overlaps(blocks, []string{"a", "b"}, ov)
	fmt.Println(len(blocks), ov)
	// Output: 3 [3 1]
}
