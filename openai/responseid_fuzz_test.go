package openai

import (
	"testing"
	"unicode"
	"unicode/utf8"
)

// FuzzResponseIDReader feeds arbitrary bodies to a ResponseIDReader whole, cut in two
// at a fuzzed offset, and one byte at a time: it never panics, where the chunks split
// does not change the result, it holds no more than MaxResponseIDScan bytes, and any
// id it returns is 1 to MaxResponseIDBytes bytes of valid UTF-8 without control
// characters.
func FuzzResponseIDReader(f *testing.F) {
	for _, s := range []string{
		vllmResponse,
		createdEvent("resp_1", "\n"),
		createdEvent("resp_é😀", "\r\n"),
		createdEvent("resp_1", "\r"),
		`{"output":[{"id":"msg_1"}],"id":"resp_\u00e9\ud83d\ude00"}`,
		`{"error":{"message":"x","type":"NotFoundError","param":null,"code":404}}`,
		`{"id":"resp\ud800"}`, `{"id":5}`, `{"id":"a","id":"b"}`,
		": hi\n\ndata: {\"response\":\ndata: {\"id\":\"resp_2\"},\ndata: \"type\":\"response.created\"}\n\n",
		"data: {\"type\":\"error\",\"code\":\"x\"}\n\n",
		"data\n\ndata: [DONE]\n\n",
		" \r\n{\"id\":\"x\"}",
	} {
		f.Add([]byte(s), uint16(len(s)/2))
	}
	f.Fuzz(func(t *testing.T, body []byte, cut uint16) {
		var whole ResponseIDReader
		id, done := whole.Write(body)
		if whole.retained() > MaxResponseIDScan {
			t.Fatalf("the reader holds %d bytes", whole.retained())
		}

		at := 0
		if len(body) > 0 {
			at = int(cut) % (len(body) + 1)
		}
		var split ResponseIDReader
		split.Write(body[:at])
		splitID, splitDone := split.Write(body[at:])
		if splitID != id || splitDone != done {
			t.Fatalf("whole: %q, %v; cut at %d: %q, %v", id, done, at, splitID, splitDone)
		}

		var bytewise ResponseIDReader
		var byteID string
		var byteDone bool
		for i := range body {
			if byteID, byteDone = bytewise.Write(body[i : i+1]); byteDone {
				break
			}
		}
		if byteID != id || byteDone != done {
			t.Fatalf("whole: %q, %v; byte by byte: %q, %v", id, done, byteID, byteDone)
		}

		if id == "" {
			return
		}
		if !done {
			t.Fatalf("id %q before the reader is done", id)
		}
		if len(id) > MaxResponseIDBytes || !utf8.ValidString(id) {
			t.Fatalf("returned an invalid id %q", id)
		}
		for _, r := range id {
			if unicode.IsControl(r) {
				t.Fatalf("returned an id with a control character: %q", id)
			}
		}
	})
}
