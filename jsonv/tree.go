package jsonv

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"unicode/utf8"
	"unsafe"
)

// ErrOverBudget is wrapped by Value's error for a value that would take the decoder's
// materialised bytes past its budget ([Decoder.SetValueBudget]).
var ErrOverBudget = errors.New("over the value budget")

// valueSize is what one Value takes in an array's or an object's items.
const valueSize = int(unsafe.Sizeof(Value{}))

// SetValueBudget caps what [Decoder.Value] materialises over the decoder's life at
// bytes: valueSize (16) per array element, object member name and member value, plus
// the bytes of the texts of strings, names and numbers. A value that would pass the
// budget is consumed, its syntax checked as Value checks it, but not materialised:
// Value returns an error wrapping [ErrOverBudget] and takes nothing from the budget.
// Without a call there is no cap.
func (d *Decoder) SetValueBudget(bytes int) { d.budget = max(0, bytes) }

// Value consumes and materialises the next value.
//
// An array or an object is read twice: a first pass checks its syntax (the errors, and
// their offsets, are those of reading it once) and measures it: the item count of every
// array and object in it, and the length of its texts. The second materialises it into
// two allocations of exactly that size, one of Values and one of text, which the
// resulting tree's slices and strings share. Growing slices by appending allocated
// about five times their final size (Go grows large slices by a quarter), and a body of
// tiny values made the tree 125 times its size in allocations.
func (d *Decoder) Value() (Value, error) {
	k, err := d.Peek()
	if err != nil {
		return Value{}, err
	}
	switch k {
	case Object, Array:
		return d.tree()
	case String, Number:
		v, err := d.text(k)
		if err != nil {
			return Value{}, err
		}
		if int(v.n) > d.budget {
			return Value{}, d.overBudget(int(v.n))
		}
		d.budget -= int(v.n)
		return v, nil
	default:
		return Value{kind: k}, d.literal(k)
	}
}

// Scalar consumes and materialises the next value, which must be a string, a number,
// true, false or null; an array or an object is an error naming its kind. Unlike
// Value, it takes nothing from the value budget, nor is refused by it: like String's,
// its text is never longer than the input it was read from.
func (d *Decoder) Scalar() (Value, error) {
	k, err := d.Peek()
	if err != nil {
		return Value{}, err
	}
	switch k {
	case Object, Array:
		return Value{}, d.errorf("expected a string, a number, true, false or null, found %s", k)
	case String, Number:
		return d.text(k)
	}
	return Value{kind: k}, d.literal(k)
}

// text consumes the String or Number at d.pos and returns it.
func (d *Decoder) text(k Kind) (Value, error) {
	if k == String {
		s, err := d.str()
		if err != nil {
			return Value{}, err
		}
		return textValue(String, s), nil
	}
	lit, err := d.number()
	if err != nil {
		return Value{}, err
	}
	return textValue(Number, string(lit)), nil
}

func (d *Decoder) overBudget(need int) error {
	return fmt.Errorf("jsonv: the value at byte %d needs %d bytes, %d left of the budget: %w", d.pos, need, d.budget, ErrOverBudget)
}

// tree materialises the array or object at d.pos in two passes (see Value).
func (d *Decoder) tree() (Value, error) {
	if uint64(len(d.data)) > math.MaxUint32 {
		return Value{}, d.errorf("input of 4 GiB or more")
	}
	start := d.pos
	m := measurement{budget: d.budget, recording: true}
	d.counts.reset()
	if err := d.measure(&m); err != nil {
		return Value{}, err
	}
	need := m.items*valueSize + m.text
	if need > d.budget {
		return Value{}, d.overBudget(need)
	}
	d.budget -= need
	end := d.pos
	d.pos = start
	b := builder{items: make([]Value, m.items), text: make([]byte, 0, m.text)}
	v := d.build(&b)
	if d.pos != end || len(b.items) != 0 || len(b.text) != m.text || b.read != d.counts.n {
		// The passes disagree: a bug, which the differential tests exist to find.
		return Value{}, d.errorf("jsonv: internal error: the value measured %d items and %d bytes of text, and built %d and %d",
			m.items, m.text, m.items-len(b.items), len(b.text))
	}
	return v, nil
}

// measurement is what the first pass of Value has found so far.
type measurement struct {
	items, text int // Values in arrays' and objects' items; bytes of text
	budget      int // bytes the value may take
	// recording is true until the value passes the budget: the pass then only checks
	// the syntax, and the item-count table stops growing.
	recording bool
}

// add counts items more Values and checks the budget.
func (m *measurement) add(items int) {
	m.items += items
	if m.recording && m.items*valueSize+m.text > m.budget {
		m.recording = false
	}
}

// reserve adds an entry to the item-count table for the non-empty container being
// opened and returns it, or nil once the value has passed the budget.
func (d *Decoder) reserve(m *measurement) *uint32 {
	if !m.recording {
		return nil
	}
	return d.counts.add()
}

// itemCounts is the first pass's table of item counts. Empty containers have no entry
// (the second pass sees them empty), so it takes at most an eighth of what the tree
// does. It is a list of chunks, never moved once allocated (an entry is set when its
// container closes), so growing it allocates about what it holds, where doubling a
// slice allocated twice that again.
type itemCounts struct {
	chunks [][]uint32 // chunks[:used] hold the entries, all full but the last
	used   int
	n      int // entries
}

// maxChunk is the entries of the largest chunk; the first is 64, each next twice the
// one before.
const maxChunk = 4096

func (c *itemCounts) reset() {
	for i := range c.used {
		c.chunks[i] = c.chunks[i][:0]
	}
	c.used, c.n = 0, 0
}

// add appends an entry of 0 and returns it.
func (c *itemCounts) add() *uint32 {
	if c.used == 0 || len(c.chunks[c.used-1]) == cap(c.chunks[c.used-1]) {
		if c.used == len(c.chunks) {
			c.chunks = append(c.chunks, make([]uint32, 0, min(maxChunk, 64<<min(c.used, 16))))
		}
		c.used++
	}
	last := &c.chunks[c.used-1]
	*last = append(*last, 0)
	c.n++
	return &(*last)[len(*last)-1]
}

// measure is the first pass over the next value: it checks the syntax as reading the
// value with Members, Elements and str would, with the same errors at the same offsets,
// and adds to m what materialising it takes, recording each array's and object's item
// count in d.counts in document order (a container's entry before its children's; none
// for an empty one).
func (d *Decoder) measure(m *measurement) error {
	k, err := d.Peek()
	if err != nil {
		return err
	}
	switch k {
	case Object:
		return d.measureObject(m)
	case Array:
		return d.measureArray(m)
	case String:
		n, err := d.measureString()
		m.text += n
		m.add(0)
		return err
	case Number:
		lit, err := d.number()
		m.text += len(lit)
		m.add(0)
		return err
	}
	return d.literal(k)
}

func (d *Decoder) measureArray(m *measurement) error {
	if err := d.enter(); err != nil {
		return err
	}
	d.pos++ // [
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == ']' {
		d.pos++
		d.depth--
		return nil
	}
	count, n := d.reserve(m), 0
	for {
		if err := d.measure(m); err != nil {
			return err
		}
		n++
		m.add(1)
		d.skipSpace()
		if d.pos >= len(d.data) {
			return d.errorf("unexpected end of input in an array")
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
		case ']':
			d.pos++
			d.depth--
			if count != nil {
				*count = uint32(n)
			}
			return nil
		default:
			return d.errorf("expected ',' or ']' in an array")
		}
	}
}

func (d *Decoder) measureObject(m *measurement) error {
	if err := d.enter(); err != nil {
		return err
	}
	d.pos++ // {
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == '}' {
		d.pos++
		d.depth--
		return nil
	}
	count, n := d.reserve(m), 0
	for {
		d.skipSpace()
		if d.pos >= len(d.data) || d.data[d.pos] != '"' {
			return d.errorf("expected a member name")
		}
		keyLen, err := d.measureString()
		if err != nil {
			return err
		}
		m.text += keyLen
		d.skipSpace()
		if d.pos >= len(d.data) || d.data[d.pos] != ':' {
			return d.errorf("expected ':' after a member name")
		}
		d.pos++
		if err := d.measure(m); err != nil {
			return err
		}
		n++
		m.add(2)
		d.skipSpace()
		if d.pos >= len(d.data) {
			return d.errorf("unexpected end of input in an object")
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
		case '}':
			d.pos++
			d.depth--
			if count != nil {
				*count = uint32(n)
			}
			return nil
		default:
			return d.errorf("expected ',' or '}' in an object")
		}
	}
}

// measureString checks the string at d.pos as str does (the same errors at the same
// offsets) and returns the length of its text, without building it. str checks the
// UTF-8 of the whole text; checking each run between escapes is the same test, since
// an escape always decodes to a whole, valid rune, which cannot complete a sequence a
// run left open or be continued by the next run.
func (d *Decoder) measureString() (int, error) {
	start := d.pos + 1
	if p := start + plainRun(d.data[start:]); p < len(d.data) && d.data[p] == '"' {
		if !utf8.Valid(d.data[start:p]) {
			d.pos = start
			return 0, d.errorf("invalid UTF-8 in a string")
		}
		d.pos = p + 1
		return p - start, nil
	}
	n, valid := 0, true
	d.pos = start
	for d.pos < len(d.data) {
		run := d.pos
		d.pos += plainRun(d.data[d.pos:])
		n += d.pos - run
		valid = valid && utf8.Valid(d.data[run:d.pos])
		if d.pos == len(d.data) {
			break
		}
		switch c := d.data[d.pos]; {
		case c == '"':
			d.pos++
			if !valid {
				return 0, d.errorf("invalid UTF-8 in a string")
			}
			return n, nil
		case c == '\\':
			if d.pos+1 < len(d.data) && simpleEscapes[d.data[d.pos+1]] != 0 {
				n++
				d.pos += 2
				continue
			}
			r, err := d.escape()
			if err != nil {
				return 0, err
			}
			n += utf8.RuneLen(r)
		default:
			return 0, d.errorf("control character in a string")
		}
	}
	return 0, d.errorf("unterminated string")
}

// builder is what the second pass of Value materialises into: the unused rest of the
// tree's Values, its text so far (with the capacity of all of it), and where it is in
// the item-count table.
type builder struct {
	items []Value
	text  []byte
	// chunk and at are the next entry of the table, read the count so far.
	chunk, at, read int
}

// nextCount returns the next entry of the item-count table.
func (b *builder) nextCount(c *itemCounts) int {
	for b.at == len(c.chunks[b.chunk]) {
		b.chunk, b.at = b.chunk+1, 0
	}
	n := c.chunks[b.chunk][b.at]
	b.at++
	b.read++
	return int(n)
}

// take returns the next n Values of the tree.
func (b *builder) take(n int) []Value {
	items := b.items[:n:n]
	b.items = b.items[n:]
	return items
}

// build is the second pass over the next value, which the first has checked: it
// materialises the value, reading each container's item count from d.counts.
func (d *Decoder) build(b *builder) Value {
	d.skipSpace()
	switch c := d.data[d.pos]; c {
	case '{':
		return d.buildObject(b)
	case '[':
		return d.buildArray(b)
	case '"':
		return d.buildString(b)
	case 't':
		d.pos += len("true")
		return Value{kind: True}
	case 'f':
		d.pos += len("false")
		return Value{kind: False}
	case 'n':
		d.pos += len("null")
		return Value{}
	}
	lit, _ := d.number()
	start := len(b.text)
	b.text = append(b.text, lit...)
	return textValue(Number, unsafe.String(&b.text[start], len(lit)))
}

func (d *Decoder) buildArray(b *builder) Value {
	d.pos++ // [
	if d.skipSpace(); d.data[d.pos] == ']' {
		d.pos++
		return Value{kind: Array}
	}
	items := b.take(b.nextCount(&d.counts))
	for i := range items {
		items[i] = d.build(b)
		d.skipSpace()
		d.pos++ // , or ]
	}
	return containerValue(Array, items)
}

func (d *Decoder) buildObject(b *builder) Value {
	d.pos++ // {
	if d.skipSpace(); d.data[d.pos] == '}' {
		d.pos++
		return Value{kind: Object}
	}
	items := b.take(2 * b.nextCount(&d.counts))
	for i := 0; i < len(items); i += 2 {
		d.skipSpace()
		items[i] = d.buildString(b)
		d.skipSpace()
		d.pos++ // :
		items[i+1] = d.build(b)
		d.skipSpace()
		d.pos++ // , or }
	}
	return containerValue(Object, dedupe(items))
}

// buildString materialises the string at d.pos, which measureString has checked.
func (d *Decoder) buildString(b *builder) Value {
	start := len(b.text)
	d.pos++ // "
	for {
		run := d.pos
		d.pos += plainRun(d.data[d.pos:])
		b.text = append(b.text, d.data[run:d.pos]...)
		if d.data[d.pos] == '"' {
			d.pos++
			break
		}
		// A backslash: the first pass saw no control character.
		if e := simpleEscapes[d.data[d.pos+1]]; e != 0 {
			b.text = append(b.text, e)
			d.pos += 2
			continue
		}
		r, _ := d.escape()
		b.text = utf8.AppendRune(b.text, r)
	}
	if len(b.text) == start {
		return Value{kind: String}
	}
	return textValue(String, unsafe.String(&b.text[start], len(b.text)-start))
}

// linearKeys is the object size up to which keys are deduped by a scan.
const linearKeys = 16

// dedupe removes the repeated keys of an object's members (key, value, key, value…),
// keeping each key at its first position with its last value (Python's json), and
// returns the members left, a prefix of items. Past linearKeys members it sorts their
// indices by key instead of scanning, so a hostile object of many keys costs
// O(n log n) time and 4 bytes per member.
func dedupe(items []Value) []Value {
	n := len(items) / 2
	if n <= linearKeys {
		kept := 0
	members:
		for i := 0; i < len(items); i += 2 {
			key := items[i].Str()
			for j := 0; j < kept; j += 2 {
				if items[j].Str() == key {
					items[j+1] = items[i+1]
					continue members
				}
			}
			items[kept], items[kept+1] = items[i], items[i+1]
			kept += 2
		}
		return items[:kept]
	}
	order := make([]int32, n)
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(a, b int32) int {
		if c := strings.Compare(items[2*a].Str(), items[2*b].Str()); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	repeated := false
	for i := 1; i < n; i++ {
		first, at := order[i-1], order[i]
		if items[2*first].Str() != items[2*at].Str() {
			continue
		}
		// order[i-1] holds the run's first position (it takes this value, the run's
		// last so far); the key at order[i] is marked for removal as a null.
		items[2*first+1] = items[2*at+1]
		items[2*at] = Value{}
		order[i] = first
		repeated = true
	}
	if !repeated {
		return items
	}
	kept := 0
	for i := 0; i < len(items); i += 2 {
		if items[i].kind == String {
			items[kept], items[kept+1] = items[i], items[i+1]
			kept += 2
		}
	}
	return items[:kept]
}
