package openai

import "bytes"

// MaxResponseIDScan is how much of a Responses API response body a [ResponseIDReader]
// reads looking for the response's id, in bytes from the body's start. Engines write
// the id near the start (vLLM: first in a whole body, and in the first event of a
// stream), so the bound only costs an id written after 64 KiB of other members, while
// it caps what a hostile or huge body makes kvroute read on the response path. A
// stream's first event repeats the request's instructions and tools before its
// "type", which vLLM writes last: an event whose response id lies within the bound
// but whose type lies past it still gives that id, since every event that carries a
// "response" object carries that response's own id.
const MaxResponseIDScan = 64 << 10

// ResponseIDReader finds a Responses API response's id in its body as the body passes
// chunk by chunk (Envoy streams it), so that a later request naming the id as its
// previous_response_id can be sent to the worker that stored the response. It keeps no
// copy of the body: only the state of a scan of it and the text of the id being read
// (at most [MaxResponseIDBytes] bytes), plus a bit per level of nesting.
//
// The body's first byte other than JSON whitespace decides its shape:
//
//   - '{': a whole JSON response, whose top-level "id" member is the id. Any member
//     order works; a nested "id" (an output item's) is not taken.
//   - anything else: a server-sent event stream (stream: true). The id is the
//     "response" object's "id" in the first event that has data, whose JSON has "type":
//     "response.created", or no "type" within [MaxResponseIDScan] bytes of the body.
//     Lines end in LF, CRLF or CR; data lines are joined with LF, as the SSE spec says;
//     comments and other fields (event, id, retry) are ignored.
//
// The id must be a JSON string whose text is 1 to MaxResponseIDBytes bytes of valid
// UTF-8 without control characters (it comes from an engine, and goes into a map and
// logs); any other value means no id. A key given twice counts once, the first time:
// the reader decides as early as it can, and engines do not repeat keys. The reader
// checks the JSON's structure (strings, brackets, colons and commas), not the spelling
// of numbers, true, false and null, which it never reads. It reads what it needs only:
// a whole body's id counts once its string is closed, whatever follows; an event's,
// once its "type" is known or the event's JSON is closed.
//
// The zero value is ready to use. A ResponseIDReader reads one body and, like a
// [ModelRenamer], is not safe for concurrent use. It is up to the caller to feed it
// only the bodies of successful responses (HTTP 200).
type ResponseIDReader struct {
	read  int // bytes of the body read, at most MaxResponseIDScan
	done  bool
	id    string
	shape bodyShape
	sse   sseLines
	json  idScanner
}

type bodyShape uint8

const (
	shapeUnknown bodyShape = iota // only JSON whitespace so far
	shapeJSON
	shapeSSE
)

// Write reads the next chunk of the body. It returns the id once found (done true), or
// done true with "" when the body cannot carry one: it is not JSON or not an event
// stream as above, the member or event that would hold the id holds something else, or
// the first MaxResponseIDScan bytes of the body hold no id. Until then it returns "",
// false; a body that ends before the reader is done has no id (a whole body cut short,
// or a stream whose first event is), so there is nothing to call at its end. Once
// done, Write returns the same result and reads nothing more. chunk is not kept.
func (r *ResponseIDReader) Write(chunk []byte) (id string, done bool) {
	if r.done {
		return r.id, true
	}
	// The scan ends at the bound whatever lies past it.
	chunk = chunk[:min(len(chunk), MaxResponseIDScan-r.read)]
	for len(chunk) > 0 && !r.done {
		n := r.consume(chunk)
		r.read += n
		chunk = chunk[n:]
	}
	if !r.done && r.read >= MaxResponseIDScan {
		r.atBound()
	}
	return r.id, r.done
}

// consume reads from the start of chunk, which is not empty, and returns how many
// bytes it read: a run of JSON (a whole body's, or an event's data line) up to
// whatever decides the scan, or one byte of anything else.
func (r *ResponseIDReader) consume(chunk []byte) int {
	switch {
	case r.shape == shapeJSON:
		n := r.json.feed(chunk)
		r.decideJSON()
		return n
	case r.shape == shapeSSE && r.sse.state == inDataValue:
		end := bytes.IndexAny(chunk, "\r\n")
		if end < 0 {
			end = len(chunk)
		}
		if end > 0 {
			n := r.json.feed(chunk[:end])
			r.decideSSE()
			return n
		}
	}
	r.step(chunk[0])
	return 1
}

func (r *ResponseIDReader) finish(id string) {
	r.done, r.id = true, id
	// Release what the scan held: a finished reader may be kept with its request.
	r.json = idScanner{}
}

// step reads one byte of the body.
func (r *ResponseIDReader) step(c byte) {
	switch r.shape {
	case shapeUnknown:
		switch c {
		case ' ', '\t', '\n', '\r':
			// Whitespace before an event stream's first line is part of the stream
			// (blank lines, or a field name starting with a space): read it as such,
			// in case that is what the body is.
			r.sseByte(c)
			return
		case '{':
			r.shape = shapeJSON
		default:
			r.shape = shapeSSE
			r.sseByte(c)
			return
		}
		fallthrough
	case shapeJSON:
		r.json.step(c)
		r.decideJSON()
	case shapeSSE:
		r.sseByte(c)
	}
}

// decideJSON finishes a whole body's scan when it has found the id, or cannot.
func (r *ResponseIDReader) decideJSON() {
	s := &r.json
	switch {
	case s.topID != unseen:
		r.finish(s.topIDText) // "" when not a valid id
	case s.failed || s.closed:
		r.finish("")
	}
}

// decideSSE finishes an event stream's scan once the first data event's JSON tells
// its id, or that it has none.
func (r *ResponseIDReader) decideSSE() {
	s := &r.json
	switch {
	case s.failed || s.typ == typeOther || s.respID == bad:
		r.finish("")
	case s.respID == good && (s.typ == typeCreated || s.closed):
		r.finish(s.respIDText)
	case s.closed:
		r.finish("")
	}
}

// atBound ends the scan at MaxResponseIDScan bytes. An event whose response id has
// been read but whose type comes later (vLLM writes "type" last, after the response,
// whose instructions and tools can pass the bound) gives that id: every event carrying
// a "response" object carries the response's own (response.created, .in_progress,
// .completed and the like), so the type does not change whose id it is.
func (r *ResponseIDReader) atBound() {
	s := &r.json
	if r.shape == shapeSSE && s.respID == good && s.typ == typeUnseen {
		r.finish(s.respIDText)
		return
	}
	r.finish("")
}

// sseLines is where the reader is in an event stream's lines.
type sseLines struct {
	state eventLine
	// name is how many bytes of "data" the line's field name has matched so far, or
	// -1 once it is another name.
	name int8
	// afterCR: the last byte ended a line with a CR, so an LF next is part of it.
	// (The space the SSE spec drops at the start of a data value is JSON whitespace,
	// so it is not dropped.)
	afterCR bool
	// data: the event being read has a data line, so it is the first with data: its
	// data goes to the JSON scan, and its end ends the reader's search.
	data bool
}

type eventLine uint8

const (
	atLineStart   eventLine = iota
	inFieldName             // a field's name
	inDataValue             // a data field's value
	inSkippedLine           // a comment, or another field's value
)

func (r *ResponseIDReader) sseByte(c byte) {
	l := &r.sse
	if l.afterCR {
		l.afterCR = false
		if c == '\n' {
			return
		}
	}
	switch c {
	case '\r':
		l.afterCR = true
		r.endLine()
		return
	case '\n':
		r.endLine()
		return
	}
	switch l.state {
	case atLineStart:
		if c == ':' {
			l.state = inSkippedLine
			return
		}
		l.state, l.name = inFieldName, 0
		fallthrough
	case inFieldName:
		switch {
		case c == ':' && l.name == 4:
			r.dataLine()
			l.state = inDataValue
		case c == ':':
			l.state = inSkippedLine
		case l.name >= 0 && l.name < 4 && c == "data"[l.name]:
			l.name++
		default:
			l.name = -1
		}
	case inDataValue:
		r.json.step(c)
		r.decideSSE()
	}
}

// endLine ends a line of the stream: a blank one ends the event.
func (r *ResponseIDReader) endLine() {
	l := &r.sse
	switch l.state {
	case atLineStart:
		if l.data {
			// The first data event ended without its JSON telling an id.
			r.finish("")
		}
	case inFieldName:
		if l.name == 4 { // "data" without a colon: a data line with an empty value
			r.dataLine()
		}
	}
	l.state = atLineStart
}

// dataLine starts a data line of the event: its value joins the data with an LF.
func (r *ResponseIDReader) dataLine() {
	if r.sse.data {
		r.json.step('\n')
		r.decideSSE()
	}
	r.sse.data = true
}

// retained is the bytes the reader holds beyond its own struct.
func (r *ResponseIDReader) retained() int {
	return cap(r.json.buf) + 8*cap(r.json.arrays)
}
