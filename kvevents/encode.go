package kvevents

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Form is how events are encoded: maps (vLLM since PR #42892, SGLang since #37482) or
// arrays (older engines).
type Form uint8

const (
	// FormMap encodes each event as {"type": …, field: value, …}.
	FormMap Form = iota
	// FormArray encodes each event as [type, field, …] in field order.
	FormArray
)

// Encode encodes a batch as an engine publishes it: `[ts, [event, …], rank]` (rank nil
// when the batch has none), each event in the given form. BlockStored carries its
// fields through lora_name, then extra_keys, group_idx and kv_cache_spec_kind when
// set (a map omits those at their defaults, as msgspec does; an array carries them up
// to the last one set), and SGLang's cache_salt in map form. Unknown event types are
// an error.
func Encode(b *Batch, form Form) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	if err := encodeBatch(enc, b, form); err != nil {
		return nil, fmt.Errorf("kvevents: encode: %w", err)
	}
	return buf.Bytes(), nil
}

func encodeBatch(enc *msgpack.Encoder, b *Batch, form Form) error {
	if err := enc.EncodeArrayLen(3); err != nil {
		return err
	}
	if err := enc.EncodeFloat64(b.TS); err != nil {
		return err
	}
	if err := enc.EncodeArrayLen(len(b.Events)); err != nil {
		return err
	}
	for i := range b.Events {
		if err := encodeEvent(enc, &b.Events[i], form); err != nil {
			return err
		}
	}
	if !b.HasRank {
		return enc.EncodeNil()
	}
	return enc.EncodeInt(int64(b.Rank))
}

// field is one encoded field: its map key and how to write its value.
type field struct {
	name  string
	write func(*msgpack.Encoder) error
}

func encodeEvent(enc *msgpack.Encoder, ev *Event, form Form) error {
	var fields []field
	switch ev.Type {
	case TypeBlockStored:
		fields = []field{
			{"block_hashes", hashesWriter(ev.BlockHashes)},
			{"parent_block_hash", func(e *msgpack.Encoder) error {
				switch {
				case ev.HasParent:
					return e.EncodeUint64(ev.Parent)
				case ev.ZeroParent:
					return e.EncodeUint64(0)
				}
				return e.EncodeNil()
			}},
			{"token_ids", func(e *msgpack.Encoder) error {
				if err := e.EncodeArrayLen(len(ev.TokenIDs)); err != nil {
					return err
				}
				for _, t := range ev.TokenIDs {
					if err := e.EncodeUint32(t); err != nil {
						return err
					}
				}
				return nil
			}},
			{"block_size", func(e *msgpack.Encoder) error { return e.EncodeInt(int64(ev.BlockSize)) }},
			{"lora_id", func(e *msgpack.Encoder) error {
				if !ev.HasLoRAID {
					return e.EncodeNil()
				}
				return e.EncodeInt(ev.LoRAID)
			}},
			{"medium", optString(ev.Medium)},
			{"lora_name", optString(ev.LoRAName)},
		}
		// The optional fields, in order; an array carries each up to the last one set.
		optional := []field{
			{"extra_keys", func(e *msgpack.Encoder) error { return encodeExtraKeys(e, ev.ExtraKeys) }},
			{"group_idx", func(e *msgpack.Encoder) error { return e.EncodeInt(int64(ev.GroupIdx)) }},
			{"kv_cache_spec_kind", optString(ev.SpecKind)},
		}
		set := []bool{ev.ExtraKeys != nil, ev.GroupIdx != 0, ev.SpecKind != ""}
		last := -1
		for i, ok := range set {
			if ok {
				last = i
			}
		}
		for i := 0; i <= last; i++ {
			if set[i] || form == FormArray {
				fields = append(fields, optional[i])
			}
		}
		if ev.CacheSalt != "" && form == FormMap { // SGLang's named field
			fields = append(fields, field{"cache_salt", optString(ev.CacheSalt)})
		}
	case TypeBlockRemoved:
		fields = []field{{"block_hashes", hashesWriter(ev.BlockHashes)}, {"medium", optString(ev.Medium)}}
		if ev.GroupIdx != 0 {
			fields = append(fields, field{"group_idx", func(e *msgpack.Encoder) error { return e.EncodeInt(int64(ev.GroupIdx)) }})
		}
	case TypeAllBlocksCleared:
	default:
		return fmt.Errorf("event type %d", ev.Type)
	}
	if form == FormArray {
		if err := enc.EncodeArrayLen(1 + len(fields)); err != nil {
			return err
		}
		if err := enc.EncodeString(ev.Type.String()); err != nil {
			return err
		}
	} else {
		if err := enc.EncodeMapLen(1 + len(fields)); err != nil {
			return err
		}
		if err := enc.EncodeString("type"); err != nil {
			return err
		}
		if err := enc.EncodeString(ev.Type.String()); err != nil {
			return err
		}
	}
	for _, f := range fields {
		if form == FormMap {
			if err := enc.EncodeString(f.name); err != nil {
				return err
			}
		}
		if err := f.write(enc); err != nil {
			return err
		}
	}
	return nil
}

// encodeExtraKeys writes one tuple per block: its strings, then its other keys as one
// opaque 8-byte key (decoding hashes it again, so Other does not round-trip, only
// its presence does).
func encodeExtraKeys(e *msgpack.Encoder, keys []ExtraKeys) error {
	if keys == nil {
		return e.EncodeNil()
	}
	if err := e.EncodeArrayLen(len(keys)); err != nil {
		return err
	}
	for _, k := range keys {
		n := len(k.Strings)
		if k.Other != 0 {
			n++
		}
		if n == 0 {
			if err := e.EncodeNil(); err != nil {
				return err
			}
			continue
		}
		if err := e.EncodeArrayLen(n); err != nil {
			return err
		}
		for _, s := range k.Strings {
			if err := e.EncodeString(s); err != nil {
				return err
			}
		}
		if k.Other != 0 {
			if err := e.EncodeBytes(binary.BigEndian.AppendUint64(nil, k.Other)); err != nil {
				return err
			}
		}
	}
	return nil
}

func hashesWriter(hashes []uint64) func(*msgpack.Encoder) error {
	return func(e *msgpack.Encoder) error {
		if err := e.EncodeArrayLen(len(hashes)); err != nil {
			return err
		}
		for _, h := range hashes {
			if err := e.EncodeUint64(h); err != nil {
				return err
			}
		}
		return nil
	}
}

func optString(s string) func(*msgpack.Encoder) error {
	return func(e *msgpack.Encoder) error {
		if s == "" {
			return e.EncodeNil()
		}
		return e.EncodeString(s)
	}
}
