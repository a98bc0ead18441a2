package kvevents

import (
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// The Decoder's msgpack reading primitives. Each checks lengths against the bytes left
// in the payload before they size anything, and refuses deep nesting.

// optText reads nil (""), or a string or byte string of at most maxTextBytes.
func (d *Decoder) optText() (string, bool, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return "", false, err
	}
	if c == msgpcode.Nil {
		return "", true, d.dec.DecodeNil()
	}
	if !isBytes(c) {
		return "", false, d.skip(0)
	}
	b, err := d.bytes()
	if err != nil {
		return "", false, err
	}
	if len(b) > maxTextBytes {
		return "", false, nil
	}
	return string(b), true, nil
}

// key reads a string (or byte string) into scratch space; a longer one than
// maxKeyBytes reads as the empty key, which matches nothing.
func (d *Decoder) key() ([]byte, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return nil, err
	}
	if !isBytes(c) {
		return nil, d.skip(0)
	}
	n, err := d.dec.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	if n > d.r.Len() {
		return nil, io.ErrUnexpectedEOF
	}
	if n > maxKeyBytes {
		_, err := d.r.Seek(int64(n), io.SeekCurrent)
		return nil, err
	}
	b := d.scratch[:n]
	return b, d.dec.ReadFull(b)
}

// bytes reads a string or byte string without copying: the result aliases the payload.
func (d *Decoder) bytes() ([]byte, error) {
	n, err := d.dec.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, nil
	}
	if n > d.r.Len() {
		return nil, io.ErrUnexpectedEOF
	}
	from := d.offset()
	_, err = d.r.Seek(int64(n), io.SeekCurrent)
	return d.payload[from : from+n], err
}

func (d *Decoder) float() (float64, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, err
	}
	if c == msgpcode.Nil {
		return 0, d.dec.DecodeNil()
	}
	if c != msgpcode.Float && c != msgpcode.Double && !isInt(c) {
		return 0, fmt.Errorf("msgpack code %#x is not a number", c)
	}
	return d.dec.DecodeFloat64()
}

// optInt reads nil (present false) or an integer; anything else is a shape error.
func (d *Decoder) optInt() (v int64, present bool, err error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, false, err
	}
	if c == msgpcode.Nil {
		return 0, false, d.dec.DecodeNil()
	}
	if !isInt(c) {
		if err := d.skip(0); err != nil {
			return 0, false, err
		}
		return 0, false, errShape
	}
	if isSigned(c) {
		v, err := d.dec.DecodeInt64()
		return v, true, err
	}
	u, err := d.dec.DecodeUint64()
	if u > math.MaxInt64 {
		return -1, true, err
	}
	return int64(u), true, err
}

// anyInt reads an integer as its 64 bits, signed or not.
func (d *Decoder) anyInt() (uint64, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, err
	}
	if isSigned(c) {
		v, err := d.dec.DecodeInt64()
		return uint64(v), err
	}
	return d.dec.DecodeUint64()
}

// arrayLen reads an array header (nil is -1) and checks the length against the bytes
// left, so a hostile length never sizes an allocation.
func (d *Decoder) arrayLen() (int, error) {
	n, err := d.dec.DecodeArrayLen()
	if err != nil {
		return 0, err
	}
	if n > d.r.Len() {
		return 0, fmt.Errorf("array of %d with %d bytes left", n, d.r.Len())
	}
	return n, nil
}

// arrayLenShape is arrayLen for a field that must be an array or nil: anything else
// is skipped and is a shape error.
func (d *Decoder) arrayLenShape() (int, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, err
	}
	if c != msgpcode.Nil && !isArray(c) {
		if err := d.skip(0); err != nil {
			return 0, err
		}
		return 0, errShape
	}
	return d.arrayLen()
}

func (d *Decoder) mapLen() (int, error) {
	n, err := d.dec.DecodeMapLen()
	if err != nil {
		return 0, err
	}
	if 2*n > d.r.Len() {
		return 0, fmt.Errorf("map of %d with %d bytes left", n, d.r.Len())
	}
	return n, nil
}

func (d *Decoder) skipN(n int) error {
	for range n {
		if err := d.skip(0); err != nil {
			return err
		}
	}
	return nil
}

// skip skips one value, refusing nesting deeper than maxDepth (msgpack's own Skip
// recurses without a limit).
func (d *Decoder) skip(depth int) error {
	if depth > maxDepth {
		return errors.New("nested too deep")
	}
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
		for range n {
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case isMap(c):
		n, err := d.mapLen()
		if err != nil {
			return err
		}
		for range 2 * n {
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case isBytes(c):
		// Moved past in the payload: msgpack's Skip reads it into a buffer of its size,
		// which its decoder keeps.
		_, err := d.bytes()
		return err
	case msgpcode.IsExt(c):
		_, n, err := d.dec.DecodeExtHeader()
		if err != nil {
			return err
		}
		if n > d.r.Len() {
			return io.ErrUnexpectedEOF
		}
		_, err = d.r.Seek(int64(n), io.SeekCurrent)
		return err
	}
	return d.dec.Skip()
}

func (d *Decoder) offset() int { return len(d.payload) - d.r.Len() }

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isBytes(c byte) bool {
	return msgpcode.IsString(c) || msgpcode.IsBin(c)
}

func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64)
}

func isSigned(c byte) bool {
	return c >= msgpcode.Int8 && c <= msgpcode.Int64 || msgpcode.IsFixedNum(c) && c > msgpcode.PosFixedNumHigh
}
