package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
	"github.com/zeebo/xxh3"
)

// ErrPayload wraps every error of a payload that is not msgpack of a batch.
var ErrPayload = errors.New("kvevents: bad payload")

// Limits on what one payload may ask of the decoder.
const (
	maxDepth     = 16      // nesting of skipped values
	maxRank      = 1 << 16 // data_parallel_rank
	maxBlockSize = 1 << 20 // block_size
	maxKeyBytes  = 64      // a map key we compare (longer keys are unknown keys)
	maxTextBytes = 4096    // a string we keep (medium, LoRA name, salt, kind)

	// What one batch may hold: a decoded element costs several times its bytes (an
	// Event about 200, a hash 8, an extra_keys entry 32, a string 16, a token id 4; each
	// can be one byte of payload), so a message within the 64 MiB limit is refused
	// beyond these, whatever it is made of. An engine step stores and removes far less.
	maxBatchEvents  = 1 << 18 // events kept (unknown ones are counted, not kept)
	maxBatchHashes  = 1 << 20 // block hashes, and extra_keys entries (one per block)
	maxBatchStrings = 1 << 21 // bare strings in extra_keys (a LoRA name, a cache salt)
	maxBatchTokens  = 1 << 24 // token ids

	// Past these capacities the Decoder lets its buffers go at [Decoder.Release]
	// rather than keep them for the next batch (each about 256 KB).
	keepEvents  = 1 << 10
	keepHashes  = 1 << 15
	keepExtras  = 1 << 13
	keepStrings = 1 << 14
	keepTokens  = 1 << 16
)

// Decoder decodes batch payloads. Its zero value is not usable: build it with
// [NewDecoder]. A Decoder reuses its buffers: the Batch returned by Decode, and every
// slice in it, are valid until the next call of Decode or [Decoder.Release]. Not safe
// for concurrent use.
type Decoder struct {
	r       bytes.Reader
	dec     *msgpack.Decoder
	payload []byte

	batch   Batch
	hashes  []uint64
	tokens  []uint32
	extras  []ExtraKeys
	strs    []string
	scratch [maxKeyBytes]byte
}

// NewDecoder returns a Decoder.
func NewDecoder() *Decoder {
	d := &Decoder{}
	d.dec = msgpack.NewDecoder(&d.r)
	return d
}

// Decode decodes one payload: a batch `[ts, [event, …], rank]` (rank may be nil or
// absent, trailing fields are ignored) or a map `{ts, events, data_parallel_rank}`.
// Each event is a map `{"type": …, field: value, …}` (unknown keys ignored) or an array
// `[type, field, …]` in field order (missing trailing fields take their defaults,
// unknown trailing ones are ignored); both forms may be mixed. An event whose fields
// have the wrong shape is returned with Malformed set; one of an unknown type, and an
// element that is no event (not a map or an array, or an empty array), is only counted
// (Batch.Unknown). A payload that is not a well-formed batch at all, or that holds more
// than a batch may (maxBatchEvents and the like), is an error wrapping [ErrPayload].
func (d *Decoder) Decode(payload []byte) (*Batch, error) {
	d.payload = payload
	d.r.Reset(payload)
	d.dec.Reset(&d.r)
	d.batch = Batch{Events: d.batch.Events[:0]}
	d.hashes, d.tokens, d.extras, d.strs = d.hashes[:0], d.tokens[:0], d.extras[:0], d.strs[:0]
	if err := d.decodeBatch(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrPayload, err)
	}
	if d.r.Len() != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the batch", ErrPayload, d.r.Len())
	}
	return &d.batch, nil
}

func (d *Decoder) decodeBatch() error {
	c, err := d.dec.PeekCode()
	if err != nil {
		return err
	}
	switch {
	case isArray(c):
		n, err := d.arrayLen()
		if err != nil {
			return err
		}
		if n < 2 {
			return fmt.Errorf("batch array has %d fields, want ts and events", n)
		}
		if d.batch.TS, err = d.float(); err != nil {
			return fmt.Errorf("ts: %w", err)
		}
		if err := d.decodeEvents(); err != nil {
			return err
		}
		if n >= 3 {
			if err := d.decodeRank(); err != nil {
				return err
			}
		}
		return d.skipN(n - 3)
	case isMap(c):
		n, err := d.mapLen()
		if err != nil {
			return err
		}
		sawEvents := false
		for range n {
			key, err := d.key()
			if err != nil {
				return err
			}
			switch string(key) {
			case "ts":
				if d.batch.TS, err = d.float(); err != nil {
					return fmt.Errorf("ts: %w", err)
				}
			case "events":
				sawEvents = true
				if err := d.decodeEvents(); err != nil {
					return err
				}
			case "data_parallel_rank":
				if err := d.decodeRank(); err != nil {
					return err
				}
			default:
				if err := d.skip(0); err != nil {
					return err
				}
			}
		}
		if !sawEvents {
			return errors.New("batch map has no events")
		}
		return nil
	}
	return fmt.Errorf("batch is msgpack code %#x, want an array or a map", c)
}

func (d *Decoder) decodeRank() error {
	v, ok, err := d.optInt()
	if err != nil {
		return fmt.Errorf("data_parallel_rank: %w", err)
	}
	if !ok {
		return nil
	}
	if v < 0 || v >= maxRank {
		return fmt.Errorf("data_parallel_rank %d out of range", v)
	}
	d.batch.Rank, d.batch.HasRank = int(v), true
	return nil
}

func (d *Decoder) decodeEvents() error {
	n, err := d.arrayLen()
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	for i := range n {
		hashes, tokens, extras, strs := len(d.hashes), len(d.tokens), len(d.extras), len(d.strs)
		// Each event is decoded in its place in the batch: one passed by pointer to
		// decodeEvent escaped to the heap, a second allocation for every event.
		kept := len(d.batch.Events)
		if kept == cap(d.batch.Events) {
			// Doubled: append grows a large slice by a quarter, so a large batch's
			// events were copied into ever larger slices, about five times their
			// final size allocated in passing (twice, doubled). Not sized from the
			// header's count, which an engine may inflate, nor from the payload's
			// bytes, which may hold elements that are no event.
			grown := make([]Event, kept, max(2*kept, keepEvents))
			copy(grown, d.batch.Events)
			d.batch.Events = grown
		}
		d.batch.Events = append(d.batch.Events, Event{})
		ev := &d.batch.Events[kept]
		if err := d.decodeEvent(ev); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
		if ev.Type == TypeUnknown {
			// Nothing of it is applied: counted, and neither it nor its fields kept (an
			// element can be one byte).
			d.batch.Unknown++
			d.batch.Events[kept] = Event{}
			d.batch.Events = d.batch.Events[:kept]
			d.hashes, d.tokens, d.extras, d.strs = d.hashes[:hashes], d.tokens[:tokens], d.extras[:extras], d.strs[:strs]
			continue
		}
		if kept == maxBatchEvents {
			return fmt.Errorf("more than %d events", maxBatchEvents)
		}
	}
	return nil
}

// Release lets go of the last payload and batch, which are invalid afterwards, and of
// the buffers a batch larger than usual made the Decoder grow; it keeps smaller ones
// for the next batch. Decode needs no Release before it.
func (d *Decoder) Release() {
	d.payload = nil
	d.r.Reset(nil)
	if cap(d.batch.Events) > keepEvents || cap(d.hashes) > keepHashes || cap(d.tokens) > keepTokens ||
		cap(d.extras) > keepExtras || cap(d.strs) > keepStrings {
		d.batch, d.hashes, d.tokens, d.extras, d.strs = Batch{}, nil, nil, nil, nil
		return
	}
	// The kept buffers hold no strings of a past batch (each up to maxTextBytes).
	clear(d.batch.Events)
	clear(d.strs)
	d.batch = Batch{Events: d.batch.Events[:0]}
	d.hashes, d.tokens, d.extras, d.strs = d.hashes[:0], d.tokens[:0], d.extras[:0], d.strs[:0]
}

// Field positions of the array forms, after the type tag.
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

func (d *Decoder) decodeEvent(ev *Event) error {
	c, err := d.dec.PeekCode()
	if err != nil {
		return err
	}
	switch {
	case isArray(c):
		n, err := d.arrayLen()
		if err != nil {
			return err
		}
		if n == 0 {
			ev.Malformed = "type"
			return nil
		}
		tag, err := d.key()
		if err != nil {
			return err
		}
		ev.Type = typeOf(tag)
		var fields []string
		switch ev.Type {
		case TypeBlockStored:
			fields = storedFields
		case TypeBlockRemoved:
			fields = removedFields
		}
		for i := 1; i < n; i++ {
			name := ""
			if i-1 < len(fields) {
				name = fields[i-1]
			}
			if err := d.decodeField(ev, name); err != nil {
				return err
			}
		}
	case isMap(c):
		n, err := d.mapLen()
		if err != nil {
			return err
		}
		for range n {
			key, err := d.key()
			if err != nil {
				return err
			}
			if string(key) == "type" {
				tag, err := d.key()
				if err != nil {
					return err
				}
				ev.Type = typeOf(tag)
				continue
			}
			if err := d.decodeField(ev, string(key)); err != nil {
				return err
			}
		}
	default:
		if err := d.skip(0); err != nil {
			return err
		}
		ev.Malformed = "event"
	}
	return nil
}

// decodeField decodes one named field into ev; unknown names are skipped. A value of
// the wrong shape is skipped and marks the event malformed; only a payload that is not
// msgpack is an error.
func (d *Decoder) decodeField(ev *Event, name string) error {
	var ok bool
	var err error
	switch name {
	case "block_hashes":
		ev.BlockHashes, ok, err = d.hashList()
	case "parent_block_hash":
		ev.Parent, ev.HasParent, ev.ZeroParent, ok, err = d.parent()
	case "token_ids":
		ev.TokenIDs, ev.Bigram, ok, err = d.tokenList()
	case "block_size":
		var v int64
		var present bool
		v, present, err = d.optInt()
		// 0 is what vLLM's offloading connector sends with stores named by hash alone;
		// a store with token ids needs a positive one (Applier checks).
		ok = present && v >= 0 && v <= maxBlockSize
		ev.BlockSize = int(v)
	case "lora_id":
		ev.LoRAID, ev.HasLoRAID, err = d.optInt()
		ok = true
	case "medium":
		ev.Medium, ok, err = d.optText()
	case "lora_name":
		ev.LoRAName, ok, err = d.optText()
	case "cache_salt":
		ev.CacheSalt, ok, err = d.optText()
	case "kv_cache_spec_kind":
		ev.SpecKind, ok, err = d.optText()
	case "group_idx":
		var v int64
		v, _, err = d.optInt()
		ok = v >= 0 && v < maxRank
		ev.GroupIdx = int(v)
	case "extra_keys":
		ev.ExtraKeys, ok, err = d.extraKeys()
	default:
		return d.skip(0)
	}
	if errors.Is(err, errShape) {
		ok, err = false, nil // the value was skipped
	}
	if err != nil {
		return err
	}
	if !ok && ev.Malformed == "" {
		ev.Malformed = name
	}
	return nil
}

// errShape marks a value of the wrong msgpack type, already skipped.
var errShape = errors.New("wrong shape")

func (d *Decoder) hashList() ([]uint64, bool, error) {
	n, err := d.arrayLenShape()
	if err != nil {
		return nil, false, err
	}
	if len(d.hashes)+n > maxBatchHashes {
		return nil, false, fmt.Errorf("more than %d block hashes", maxBatchHashes)
	}
	start := len(d.hashes)
	ok := n >= 0
	for range max(n, 0) {
		h, isHash, err := d.hash()
		if err != nil {
			return nil, false, err
		}
		ok = ok && isHash
		d.hashes = append(d.hashes, h)
	}
	return d.hashes[start:len(d.hashes):len(d.hashes)], ok, nil
}

// hash reads one block hash: an integer or a byte string. isHash is false (the value
// skipped) for anything else.
func (d *Decoder) hash() (key uint64, isHash bool, err error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, false, err
	}
	switch {
	case isInt(c):
		v, err := d.anyInt()
		return v, true, err
	case isBytes(c):
		b, err := d.bytes()
		return HashKey(b), true, err
	}
	return 0, false, d.skip(0)
}

// parent reads parent_block_hash: nil and 0 both mean no parent, and zero tells 0 apart.
func (d *Decoder) parent() (key uint64, has, zero, ok bool, err error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, false, false, false, err
	}
	if c == msgpcode.Nil {
		return 0, false, false, true, d.dec.DecodeNil()
	}
	key, ok, err = d.hash()
	return key, ok && key != 0, ok && key == 0, ok, err
}

// tokenList reads token_ids: integers, or EAGLE bigram pairs flattened to their first
// element.
func (d *Decoder) tokenList() (ids []uint32, bigram, ok bool, err error) {
	n, err := d.arrayLenShape()
	if err != nil {
		return nil, false, false, err
	}
	if len(d.tokens)+n > maxBatchTokens {
		return nil, false, false, fmt.Errorf("more than %d token ids", maxBatchTokens)
	}
	start := len(d.tokens)
	ok = n >= 0
	for i := 0; i < n; i++ {
		// Token ids are most of a payload's bytes: read the unsigned encodings straight
		// from it and move the reader past them once.
		if i += d.fastTokens(n - i); i == n {
			break
		}
		c, err := d.dec.PeekCode()
		if err != nil {
			return nil, false, false, err
		}
		var id uint64
		valid := false
		switch {
		case isInt(c):
			id, valid, err = d.tokenID()
		case isArray(c):
			bigram = true
			var m int
			if m, err = d.arrayLen(); err != nil {
				return nil, false, false, err
			}
			if m >= 1 {
				id, valid, err = d.tokenID()
				if err == nil {
					err = d.skipN(m - 1)
				}
			}
		default:
			err = d.skip(0)
		}
		if err != nil {
			return nil, false, false, err
		}
		ok = ok && valid
		d.tokens = append(d.tokens, uint32(id))
	}
	return d.tokens[start:len(d.tokens):len(d.tokens)], bigram, ok, nil
}

// fastTokens appends up to max token ids encoded as positive fixints or uint8, uint16
// or uint32 (always within uint32), read from the payload at the reader's position,
// and moves the reader past them. It stops at the first other encoding, which the
// caller decodes, and reports how many it read.
func (d *Decoder) fastTokens(max int) int {
	b, off, k := d.payload, d.offset(), 0
	for ; k < max && off < len(b); k++ {
		c := b[off]
		var id uint32
		switch {
		case c <= 0x7f:
			id, off = uint32(c), off+1
		case c == 0xcc && off+2 <= len(b):
			id, off = uint32(b[off+1]), off+2
		case c == 0xcd && off+3 <= len(b):
			id, off = uint32(binary.BigEndian.Uint16(b[off+1:])), off+3
		case c == 0xce && off+5 <= len(b):
			id, off = binary.BigEndian.Uint32(b[off+1:]), off+5
		default:
			_, _ = d.r.Seek(int64(off), io.SeekStart)
			return k
		}
		d.tokens = append(d.tokens, id)
	}
	_, _ = d.r.Seek(int64(off), io.SeekStart)
	return k
}

// tokenID reads an integer token id; valid is false for one outside uint32 or a value
// that is not an integer.
func (d *Decoder) tokenID() (uint64, bool, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, false, err
	}
	if c <= msgpcode.PosFixedNumHigh {
		// The decoder reads d.r directly (a bytes.Reader is a ByteScanner), so a
		// positive fixint, most token ids of small vocabularies, is one byte read.
		_, err := d.r.ReadByte()
		return uint64(c), true, err
	}
	if !isInt(c) {
		return 0, false, d.skip(0)
	}
	if isSigned(c) {
		v, err := d.dec.DecodeInt64()
		return uint64(v), err == nil && v >= 0 && v <= math.MaxUint32, err
	}
	v, err := d.dec.DecodeUint64()
	return v, err == nil && v <= math.MaxUint32, err
}

func (d *Decoder) extraKeys() ([]ExtraKeys, bool, error) {
	n, err := d.arrayLenShape()
	if err != nil {
		return nil, false, err
	}
	if n < 0 {
		return nil, true, nil
	}
	if len(d.extras)+n > maxBatchHashes {
		return nil, false, fmt.Errorf("more than %d extra_keys entries", maxBatchHashes)
	}
	start := len(d.extras)
	ok := true
	for range n {
		var ek ExtraKeys
		c, err := d.dec.PeekCode()
		if err != nil {
			return nil, false, err
		}
		switch {
		case c == msgpcode.Nil:
			err = d.dec.DecodeNil()
		case isArray(c):
			var m int
			if m, err = d.arrayLen(); err != nil {
				return nil, false, err
			}
			if len(d.strs)+m > maxBatchStrings {
				return nil, false, fmt.Errorf("more than %d extra key strings", maxBatchStrings)
			}
			first := len(d.strs)
			for range m {
				if err = d.extraKey(&ek); err != nil {
					return nil, false, err
				}
			}
			ek.Strings = d.strs[first:len(d.strs):len(d.strs)]
		default:
			ok = false
			err = d.skip(0)
		}
		if err != nil {
			return nil, false, err
		}
		d.extras = append(d.extras, ek)
	}
	return d.extras[start:len(d.extras):len(d.extras)], ok, nil
}

// extraKey reads one key of a block's extra keys: a string is kept; anything else is
// folded, as its exact bytes, into ek.Other.
func (d *Decoder) extraKey(ek *ExtraKeys) error {
	c, err := d.dec.PeekCode()
	if err != nil {
		return err
	}
	if msgpcode.IsString(c) {
		s, _, err := d.optText()
		d.strs = append(d.strs, s)
		return err
	}
	from := d.offset()
	if err := d.skip(0); err != nil {
		return err
	}
	var buf [16]byte
	binary.LittleEndian.PutUint64(buf[:8], ek.Other)
	binary.LittleEndian.PutUint64(buf[8:], xxh3.Hash(d.payload[from:d.offset()]))
	ek.Other = xxh3.Hash(buf[:]) | 1 // never 0: 0 means "no other keys"
	return nil
}
