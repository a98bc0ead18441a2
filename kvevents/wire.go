package kvevents

import (
	"encoding/binary"
	"strings"
)

// Type is an event's kind.
type Type uint8

// The event types of vLLM and SGLang; TypeUnknown is any other tag (a newer engine's),
// counted and skipped.
const (
	TypeUnknown Type = iota
	TypeBlockStored
	TypeBlockRemoved
	TypeAllBlocksCleared
)

// String returns the event type's wire tag, or "unknown".
func (t Type) String() string {
	switch t {
	case TypeBlockStored:
		return "BlockStored"
	case TypeBlockRemoved:
		return "BlockRemoved"
	case TypeAllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

func typeOf(tag []byte) Type {
	switch string(tag) {
	case "BlockStored":
		return TypeBlockStored
	case "BlockRemoved":
		return TypeBlockRemoved
	case "AllBlocksCleared":
		return TypeAllBlocksCleared
	}
	return TypeUnknown
}

// Batch is one published message's payload: the events of one engine step.
type Batch struct {
	// TS is the engine's wall clock at publication, in Unix seconds.
	TS float64
	// Events in the order the engine applied them.
	Events []Event
	// Rank is the data-parallel rank that published the batch; HasRank is false when the
	// batch carries none (nil or absent).
	Rank    int
	HasRank bool
	// Unknown counts the elements of the events array that are not in Events: events
	// of a type this version does not know (a newer engine's), and elements that are no
	// event at all. Encode ignores it.
	Unknown int
}

// Event is one KV cache event. Fields not in an event's type are zero.
type Event struct {
	Type Type
	// BlockHashes are the engine's hashes of the blocks, as keys: an integer hash
	// (signed or unsigned 64-bit) as its 64 bits, a byte-string hash (sha256-based
	// algorithms) as its last 8 bytes big-endian. They are opaque: only equality with
	// the engine's other events means anything.
	BlockHashes []uint64
	// Parent is the key of the block before the first one; HasParent is false for the
	// first block of a sequence (nil, or 0 as some publishers send).
	Parent    uint64
	HasParent bool
	// ZeroParent is set when the parent was sent as 0 rather than nil. For blocks
	// coarser than kvroute's it means the parent is not known: LMCache sends 0 before
	// the first chunk of a store that skipped the chunks it had saved already.
	ZeroParent bool
	// TokenIDs cover the stored blocks in order, BlockSize per block.
	TokenIDs  []uint32
	BlockSize int
	// Bigram is set when the engine sent token ids as EAGLE pairs [[a,b],[b,c],…]; they
	// were flattened to each pair's first element.
	Bigram bool
	// Medium is the tier the blocks live in ("" when absent or nil: the device).
	Medium string
	// LoRAName names the adapter of an adapter request; LoRAID is the deprecated
	// integer id (HasLoRAID when not nil).
	LoRAName  string
	LoRAID    int64
	HasLoRAID bool
	// ExtraKeys has one entry per block when the engine sent them: what it folded into
	// each block's hash besides the tokens.
	ExtraKeys []ExtraKeys
	// CacheSalt is SGLang's named cache_salt field (vLLM sends it in ExtraKeys[0]).
	CacheSalt string
	// GroupIdx is the KV cache group of hybrid models; SpecKind its kind
	// (full_attention, sliding_window, mamba, …; "" when not sent).
	GroupIdx int
	SpecKind string
	// Malformed is set when a field had the wrong shape; the event must not be applied
	// as it stands. It names the field.
	Malformed string
}

// ExtraKeys is one block's extra hash keys.
type ExtraKeys struct {
	// Strings are the bare string keys in order: the LoRA adapter's name (on every block
	// of an adapter request) and, on a sequence's first block, the cache salt.
	Strings []string
	// Other is a hash of every other key (multimodal identifiers, prompt-embedding
	// hashes, integer LoRA ids); 0 when there are none. A request's own hashing cannot
	// reproduce these keys, so a block with them gets a namespace no request matches.
	Other uint64
}

// Tier classifies a medium: the device, the host, or external storage.
type Tier uint8

// Tiers, as KV_EVENTS.md groups the medium names.
const (
	TierDevice Tier = iota
	TierHost
	TierExternal
)

// String returns the tier's name, as the config names it.
func (t Tier) String() string {
	switch t {
	case TierDevice:
		return "device"
	case TierHost:
		return "host"
	}
	return "external"
}

// TierOf classifies a medium name: GPU (or none) is the device; CPU, CPU_PINNED and
// CPU_TIER1 the host; anything else (CPU_TIER2, DISK, NVME, …) external.
func TierOf(medium string) Tier {
	switch strings.ToUpper(medium) {
	case "", "GPU":
		return TierDevice
	case "CPU", "CPU_PINNED", "CPU_TIER1":
		return TierHost
	}
	return TierExternal
}

// IndexableSpec reports whether a KV cache group of this kind can be a prefix index's:
// full attention and its variants hold every block of a prefix; sliding-window, Mamba
// and other groups do not, so their blocks are skipped. An empty kind (older engines,
// one group) is full attention.
func IndexableSpec(kind string) bool {
	switch kind {
	case "", "full_attention", "mla_attention", "sink_full_attention":
		return true
	}
	return false
}

// HashKey maps a byte-string block hash to a key: its last 8 bytes, big-endian
// (shorter strings are left-padded with zeros).
func HashKey(b []byte) uint64 {
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b[len(b)-8:])
	}
	var pad [8]byte
	copy(pad[8-len(b):], b)
	return binary.BigEndian.Uint64(pad[:])
}
