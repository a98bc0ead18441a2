package index

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/zeebo/xxh3"
)

func seq(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

// TestBlockHashesFollowDesignDefinition rebuilds the chain from DESIGN §4 with plain
// byte slices and compares, so a change to the fast path cannot silently change hashes.
func TestBlockHashesFollowDesignDefinition(t *testing.T) {
	tests := []struct {
		name      string
		tokens    []uint32
		blockSize int
		salt      uint64
	}{
		{"three blocks of 4", seq(0, 12), 4, 7},
		{"partial tail ignored", seq(100, 10), 4, 7},
		{"64-token blocks", seq(5, 64*5+3), 64, Salt("m", "", "")},
		{"blocks larger than the stack buffer", seq(9, 256*2), 256, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var want []uint64
			var prev uint64
			for b := 0; b+tt.blockSize <= len(tt.tokens); b += tt.blockSize {
				raw := make([]byte, 0, 4*tt.blockSize)
				for _, tok := range tt.tokens[b : b+tt.blockSize] {
					raw = binary.LittleEndian.AppendUint32(raw, tok)
				}
				local := xxh3.HashSeed(raw, tt.salt)
				if b == 0 {
					prev = local
				} else {
					pair := binary.LittleEndian.AppendUint64(nil, prev)
					pair = binary.LittleEndian.AppendUint64(pair, local)
					prev = xxh3.Hash(pair)
				}
				want = append(want, prev)
			}
			assert.Equal(t, want, BlockHashes(nil, tt.tokens, tt.blockSize, tt.salt))
		})
	}
}

// TestBlockHashVectors pins the hashes themselves: they name cache contents across
// releases and replicas, so any change must be deliberate.
func TestBlockHashVectors(t *testing.T) {
	assert.Equal(t, uint64(0x368f5a1ccc7327b3), Salt("Qwen/Qwen3-8B", "", ""))
	assert.Equal(t, uint64(0x1611811137281bc4), Salt("Qwen/Qwen3-8B", "sql-lora", ""))
	assert.Equal(t,
		[]uint64{0x42d534403afc77cc, 0x576a703421d707b6},
		BlockHashes(nil, seq(0, 8), 4, Salt("Qwen/Qwen3-8B", "", "")))
}

func TestBlockHashesAreSaltedAndChained(t *testing.T) {
	base := Salt("model-a", "", "")
	tokens := seq(0, 128)
	h := BlockHashes(nil, tokens, 64, base)

	assert.NotEqual(t, h, BlockHashes(nil, tokens, 64, Salt("model-b", "", "")), "another model never matches")
	assert.NotEqual(t, h, BlockHashes(nil, tokens, 64, Salt("model-a", "lora", "")), "a LoRA adapter is its own namespace")
	assert.NotEqual(t, h, BlockHashes(nil, tokens, 64, Salt("model-a", "", "tenant")), "a cache salt is its own namespace")
	assert.NotEqual(t, Salt("ab", "c", ""), Salt("a", "bc", ""), "fields do not run into each other")

	swapped := append(seq(64, 64), seq(0, 64)...)
	hs := BlockHashes(nil, swapped, 64, base)
	assert.NotEqual(t, h[1], hs[1], "a block's hash depends on the blocks before it")

	changedFirst := append([]uint32{999}, tokens[1:]...)
	assert.NotEqual(t, h[1], BlockHashes(nil, changedFirst, 64, base)[1], "a change in block 0 changes every later hash")

	assert.Empty(t, BlockHashes(nil, seq(0, 63), 64, base), "only full blocks are hashed")
	assert.Empty(t, BlockHashes(nil, nil, 64, base), "an empty prompt has no blocks")
}

func TestBlockHashesAppendsToDst(t *testing.T) {
	dst := []uint64{42}
	got := BlockHashes(dst, seq(0, 8), 4, 1)
	assert.Len(t, got, 3)
	assert.Equal(t, uint64(42), got[0])
}

func TestChainHashesContinuesAPromptsChain(t *testing.T) {
	salt := Salt("model-a", "", "")
	tokens := seq(0, 5*16)
	whole := BlockHashes(nil, tokens, 16, salt)
	tests := []struct {
		name string
		cuts []int // block boundaries where a new call continues the chain
	}{
		{"one call", nil},
		{"block by block", []int{1, 2, 3, 4}},
		{"two then three", []int{2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []uint64
			start := 0
			for _, end := range append(tt.cuts, 5) {
				parent, has := uint64(0), len(got) > 0
				if has {
					parent = got[len(got)-1]
				}
				got = ChainHashes(got, parent, has, tokens[start*16:end*16], 16, salt)
				start = end
			}
			assert.Equal(t, whole, got)
		})
	}
	assert.NotEqual(t, whole[1:2], ChainHashes(nil, 0, false, tokens[16:32], 16, salt), "a block without its parent hashes as a chain's first block")
}
