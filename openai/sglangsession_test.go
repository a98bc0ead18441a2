package openai

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/tokenize"
)

func TestParseSGLangGenerateReadsTheSessionATurnContinues(t *testing.T) {
	long := strings.Repeat("s", MaxSGLangSessionBytes+1)
	tests := []struct {
		name, body, session string
	}{
		{"session_params.id names the session", `{"input_ids":[1,2],"session_params":{"id":"3f2a","rid":"r1","offset":-1,"replace":false}}`, "3f2a"},
		{"text turns too", `{"text":"next turn","session_params":{"id":"abc"}}`, "abc"},
		{"the last id given counts, as Python's json keeps it", `{"text":"t","session_params":{"id":"first","id":"second"}}`, "second"},
		{"the last session_params given counts", `{"text":"t","session_params":{"id":"a"},"session_params":{"id":"b"}}`, "b"},
		{"no session_params is no session", `{"text":"t"}`, ""},
		{"null session_params is none", `{"text":"t","session_params":null}`, ""},
		{"session_params without an id is none (SGLang's id defaults to None)", `{"text":"t","session_params":{"rid":"r"}}`, ""},
		{"a null id is none", `{"text":"t","session_params":{"id":null}}`, ""},
		{"an id of another type is the engine's to refuse", `{"text":"t","session_params":{"id":7}}`, ""},
		{"an empty id is none", `{"text":"t","session_params":{"id":""}}`, ""},
		{"an id past the bound is none", `{"text":"t","session_params":{"id":"` + long + `"}}`, ""},
		{"a list of session_params is not read (no SGLang handled one)", `{"text":["a","b"],"session_params":[{"id":"x"}]}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(SGLangGenerate, []byte(tt.body), DefaultLimits())
			require.NoError(t, err)
			assert.Equal(t, tt.session, got.SGLangSession)
			if tt.session == "" {
				return
			}
			// The engine builds the turn's prompt from the session's history: the body's
			// text or ids are its tail, not a prompt to route on.
			require.Error(t, got.Unsupported)
			assert.ErrorIs(t, got.Unsupported, tokenize.ErrUnsupported)
			assert.Empty(t, got.Tokens)
			assert.Empty(t, got.Prompt)
		})
	}
}

func TestParseSGLangGenerateReadsTheSessionIDAsAKey(t *testing.T) {
	for _, tt := range []struct{ name, body, key string }{
		{"session_id is the key; the prompt stays the body's", `{"text":"t","session_id":"agent-7"}`, "agent-7"},
		{"the last one given counts", `{"text":"t","session_id":"a","session_id":"b"}`, "b"},
		{"a session_id of another type is none", `{"text":"t","session_id":7}`, ""},
		{"an empty one is none", `{"text":"t","session_id":""}`, ""},
		{"one past the bound is none", `{"text":"t","session_id":"` + strings.Repeat("k", MaxSGLangSessionBytes+1) + `"}`, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(SGLangGenerate, []byte(tt.body), DefaultLimits())
			require.NoError(t, err)
			assert.Equal(t, tt.key, got.SessionKey)
			assert.Empty(t, got.SGLangSession, "an identity, not state an engine holds")
			assert.NoError(t, got.Unsupported)
			assert.Equal(t, "t", got.Prompt)
		})
	}
	// Beside session_params (which SGLang refuses with it: the engine's to judge), both
	// are read and the turn goes by load.
	got, err := Parse(SGLangGenerate, []byte(`{"text":"t","session_id":"k","session_params":{"id":"s"}}`), DefaultLimits())
	require.NoError(t, err)
	assert.Equal(t, "k", got.SessionKey)
	assert.Equal(t, "s", got.SGLangSession)
	assert.Error(t, got.Unsupported)
}

func TestParseSGLangSessionControlReadsTheSessionToOpenOrClose(t *testing.T) {
	tests := []struct {
		name, body, session string
	}{
		{"session_id names it", `{"session_id":"3f2a"}`, "3f2a"},
		{"other members are skipped", `{"rid":"x","session_id":"s","extra":{"a":[1]}}`, "s"},
		{"the last one given counts", `{"session_id":"a","session_id":"b"}`, "b"},
		{"no session_id is none: the engine answers its 400", `{}`, ""},
		{"an id of another type is none", `{"session_id":["s"]}`, ""},
		{"an empty id is none", `{"session_id":""}`, ""},
	}
	for _, endpoint := range []Endpoint{SGLangCloseSession, SGLangOpenSession} {
		for _, tt := range tests {
			t.Run(endpoint.String()+"/"+tt.name, func(t *testing.T) {
				got, err := Parse(endpoint, []byte(tt.body), DefaultLimits())
				require.NoError(t, err)
				assert.Equal(t, tt.session, got.SGLangSession)
				assert.NotNil(t, got.Tokens, "routed by load: an empty prompt, not none")
				assert.Empty(t, got.Tokens)
				assert.Empty(t, got.Model)
			})
		}
		for _, body := range []string{`[1]`, `"s"`, `{"session_id":`, ``} {
			_, err := Parse(endpoint, []byte(body), DefaultLimits())
			var fe *FieldError
			assert.True(t, errors.As(err, &fe), "a body that is not a JSON object is the client's 400: %q gave %v", body, err)
		}
	}
}

func TestSGLangSessionIDReaderReadsTheOpenedSessionsID(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{"FastAPI's answer: the id as a JSON string", `"3f2a9c"`, "3f2a9c"},
		{"whitespace around it", " \r\n\t\"abc\"\n", "abc"},
		{"escapes are read", `"a\"b\\c\u00e9"`, "a\"b\\cé"},
		{"an error object has none", `{"error":{"message":"Failed to open the session."}}`, ""},
		{"a number has none", `17`, ""},
		{"null has none", `null`, ""},
		{"an empty id is none", `""`, ""},
		{"an id with a control character is none", `"a\u0001b"`, ""},
		{"a raw control character is none", "\"a\x01b\"", ""},
		{"invalid UTF-8 is none", "\"a\xffb\"", ""},
		{"a lone surrogate is none", `"a\ud800"`, ""},
		{"an id past the bound is none", `"` + strings.Repeat("x", MaxSGLangSessionBytes+1) + `"`, ""},
		{"the longest id is read", `"` + strings.Repeat("x", MaxSGLangSessionBytes) + `"`, strings.Repeat("x", MaxSGLangSessionBytes)},
		{"escaped at the bound is read", `"` + strings.Repeat(`\u0078`, MaxSGLangSessionBytes) + `"`, strings.Repeat("x", MaxSGLangSessionBytes)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Whole, then a byte at a time: Envoy's chunks fall anywhere.
			var whole SGLangSessionIDReader
			id, done := whole.Write([]byte(tt.body))
			assert.True(t, done)
			assert.Equal(t, tt.want, id)

			var bytewise SGLangSessionIDReader
			id, done = "", false
			for i := 0; i < len(tt.body) && !done; i++ {
				id, done = bytewise.Write([]byte{tt.body[i]})
			}
			assert.True(t, done)
			assert.Equal(t, tt.want, id)
			again, stillDone := bytewise.Write([]byte(`"other"`))
			assert.True(t, stillDone)
			assert.Equal(t, tt.want, again, "once done, a reader reads nothing more")
		})
	}
	t.Run("an unclosed string is undecided until the bound", func(t *testing.T) {
		var r SGLangSessionIDReader
		_, done := r.Write([]byte(`"abc`))
		assert.False(t, done)
		id, done := r.Write([]byte(strings.Repeat("x", maxSGLangSessionAnswer)))
		assert.True(t, done)
		assert.Empty(t, id)
		assert.Nil(t, r.body, "a finished reader keeps no body")
	})
}

// FuzzParseSGLangSessionControl: an /open_session or /close_session body is read or
// (not a JSON object) refused as the client's 400; never a panic, and what is read
// keeps the bound and is what a body not parsed gives.
func FuzzParseSGLangSessionControl(f *testing.F) {
	for _, s := range []string{`{"session_id":"s"}`, `{"session_id":1}`, `{}`, `[]`, `{"session_id":"a","session_id":"b"}`, `{`,
		`{"capacity_of_str_len":10,"session_id":"x","streaming":true}`} {
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, body string, open bool) {
		endpoint := SGLangCloseSession
		if open {
			endpoint = SGLangOpenSession
		}
		lim := Limits{MaxDepth: 16, MaxPromptTokens: 64}
		got, err := Parse(endpoint, []byte(body), lim)
		session, _, busyErr := ParseSGLangSessions(endpoint, []byte(body), lim)
		if (err == nil) != (busyErr == nil) || session != got.SGLangSession {
			t.Fatalf("Parse %q %v; ParseSGLangSessions (a body not parsed) %q %v", got.SGLangSession, err, session, busyErr)
		}
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || !errors.Is(err, ErrBadRequest) {
				t.Fatalf("rejection is not a *FieldError: %v", err)
			}
			return
		}
		if len(got.SGLangSession) > MaxSGLangSessionBytes || got.Tokens == nil || len(got.Tokens) > 0 || got.Prompt != "" || got.Chat != nil {
			t.Fatalf("a %s body read as %+v", endpoint, got)
		}
	})
}

// FuzzSGLangSessionIDReader: whatever the body and however it is cut, the reader takes
// the id encoding/json reads from a body that is one JSON string, when it is an id kvroute
// takes, and nothing from any other body.
func FuzzSGLangSessionIDReader(f *testing.F) {
	for _, s := range []string{`"3f2a"`, ` "a\"b" `, `{"error":{}}`, `"\u0000"`, `"abc`, `""`, "\"\xff\"", `"a"x`} {
		f.Add(s, uint8(3))
	}
	f.Fuzz(func(t *testing.T, body string, cut uint8) {
		var r SGLangSessionIDReader
		id, done := "", false
		step := int(cut)%7 + 1
		for i := 0; i < len(body) && !done; i += step {
			id, done = r.Write([]byte(body[i:min(i+step, len(body))]))
		}
		if id == "" {
			return
		}
		if !done || len(id) > MaxSGLangSessionBytes || !utf8.ValidString(id) || strings.ContainsFunc(id, func(c rune) bool { return c < 0x20 }) {
			t.Fatalf("an id kvroute does not take: %q (done %v)", id, done)
		}
		// The body up to the id's closing quote is a JSON string encoding/json reads as
		// the id.
		trimmed := strings.TrimLeft(body, " \t\r\n")
		var want string
		dec := json.NewDecoder(strings.NewReader(trimmed))
		if err := dec.Decode(&want); err != nil || want != id {
			t.Fatalf("read %q from %q; encoding/json reads %q (%v)", id, body, want, err)
		}
	})
}

// TestParseSGLangSessionsReadsWhatParseReads: the sessions a body routed without being
// parsed (max_concurrent_body_bytes) names are those Parse reads from it.
func TestParseSGLangSessionsReadsWhatParseReads(t *testing.T) {
	long := strings.Repeat("s", MaxSGLangSessionBytes+1)
	for _, tt := range []struct {
		name     string
		endpoint Endpoint
		body     string
	}{
		{"a turn", SGLangGenerate, `{"text":"t","session_params":{"rid":"r","id":"3f2a"},"session_id":"agent"}`},
		{"the last id counts", SGLangGenerate, `{"text":"t","session_params":{"id":"first","id":"second"}}`},
		{"the last session_params counts", SGLangGenerate, `{"session_params":{"id":"a"},"text":"t","session_params":{"rid":"b"}}`},
		{"a list of session_params is none", SGLangGenerate, `{"text":["a","b"],"session_params":[{"id":"x"}]}`},
		{"an id that is not a string is none", SGLangGenerate, `{"text":"t","session_params":{"id":{"a":1}},"session_id":["k"]}`},
		{"an id past the bound is none", SGLangGenerate, `{"text":"t","session_params":{"id":"` + long + `"}}`},
		{"a turn's top-level session_id is a key, not a session", SGLangGenerate, `{"input_ids":[1],"session_id":"k"}`},
		{"a close", SGLangCloseSession, `{"session_id":"3f2a","session_params":{"id":"x"}}`},
		{"a close naming none", SGLangCloseSession, `{"rid":"x"}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			want, err := Parse(tt.endpoint, []byte(tt.body), DefaultLimits())
			require.NoError(t, err)
			session, key, err := ParseSGLangSessions(tt.endpoint, []byte(tt.body), DefaultLimits())
			require.NoError(t, err)
			assert.Equal(t, want.SGLangSession, session)
			assert.Equal(t, want.SessionKey, key)
		})
	}
	t.Run("a body that is not a JSON object is the client's 400", func(t *testing.T) {
		for _, body := range []string{`[]`, `{"session_id":"a"`, `{"session_params":{"id":"a"}} x`} {
			_, _, err := ParseSGLangSessions(SGLangGenerate, []byte(body), DefaultLimits())
			var fe *FieldError
			assert.True(t, errors.As(err, &fe), "%s: %v", body, err)
		}
	})
}
