package index

import (
	"encoding/binary"

	"github.com/zeebo/xxh3"
)

// Salt derives the seed of the block hashes of one cache namespace. Blocks only match
// within the same model, LoRA adapter and cache salt: different namespaces give different
// seeds. The empty LoRA and cache salt are the base model's namespace.
func Salt(model, lora, cacheSalt string) uint64 {
	if lora == "" && cacheSalt == "" {
		return xxh3.HashString(model)
	}
	// A separator that cannot occur in the fields keeps ("a","bc") apart from ("ab","c").
	return xxh3.HashString(model + "\x00lora=" + lora + "\x00salt=" + cacheSalt)
}

// BlockHashes appends to dst the chained hashes of the full blocks of tokens and returns
// the extended slice (DESIGN §4). A block's local hash is XXH3-64 of its token ids as
// little-endian uint32, seeded by salt; the first chained hash is the first local hash
// and each next one is XXH3-64 of the previous chained hash and the block's local hash,
// both little-endian uint64. A trailing partial block is not hashed. blockSize must be
// positive.
func BlockHashes(dst []uint64, tokens []uint32, blockSize int, salt uint64) []uint64 {
	return ChainHashes(dst, 0, false, tokens, blockSize, salt)
}

// ChainHashes is [BlockHashes] for blocks that continue a chain: when hasParent is set,
// the first block is chained to parent (the chained hash of the block before it), so
// hashing a prompt's blocks in several calls, each continuing from the last hash of the
// previous one, gives the hashes of one call over the whole prompt. This is how blocks
// reported by an engine, a few at a time, get the hashes a request's prompt gets.
func ChainHashes(dst []uint64, parent uint64, hasParent bool, tokens []uint32, blockSize int, salt uint64) []uint64 {
	full := len(tokens) / blockSize
	if full == 0 {
		return dst
	}
	var stack [256]byte // one 64-token block; larger blocks use the heap
	buf := stack[:0]
	if n := blockSize * 4; n > len(stack) {
		buf = make([]byte, 0, n)
	}
	var pair [16]byte
	prev := parent
	for b := range full {
		buf = buf[:0]
		for _, t := range tokens[b*blockSize : (b+1)*blockSize] {
			buf = binary.LittleEndian.AppendUint32(buf, t)
		}
		local := xxh3.HashSeed(buf, salt)
		if b == 0 && !hasParent {
			prev = local
		} else {
			binary.LittleEndian.PutUint64(pair[:8], prev)
			binary.LittleEndian.PutUint64(pair[8:], local)
			prev = xxh3.Hash(pair[:])
		}
		dst = append(dst, prev)
	}
	return dst
}
