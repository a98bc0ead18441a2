package filter

import "testing"

// TestCutShortTellsACutBodyFromAWholeOrMalformedOne pins what BUFFERED_PARTIAL's 413
// rests on: every proper prefix of a request is cut short, and neither the whole
// request nor a malformed one is.
func TestCutShortTellsACutBodyFromAWholeOrMalformedOne(t *testing.T) {
	whole := `{"model":"m","messages":[{"role":"user","content":"hi \"there\" \u00e9 ☃"}],"max_tokens":128,"stream":true,"stop":null,"temperature":-1.5e-3,"logprobs":false}`
	for k := 0; k < len(whole); k++ {
		if !cutShort([]byte(whole[:k])) {
			t.Errorf("the first %d bytes %q are not cut short", k, whole[:k])
		}
	}
	tests := []struct {
		name string
		body string
		want bool
	}{
		{"whole", whole, false},
		{"whole with trailing whitespace", whole + " \n", false},
		{"a value after the document", whole + "x", false},
		{"a bad character inside", `{"model":x}`, false},
		{"a missing colon", `{"model" "m"}`, false},
		{"a bad escape", `{"model":"\q"}`, false},
		{"cut inside a literal", `{"stream":tr`, true},
		{"cut inside a unicode escape", `{"model":"\u00`, true},
		{"only whitespace", "  ", true},
		{"whole after a byte order mark", "\xef\xbb\xbf" + whole, false},
		{"cut after a byte order mark", "\xef\xbb\xbf" + whole[:40], true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := cutShort([]byte(tt.body)); got != tt.want {
				t.Errorf("cutShort(%q) = %v, want %v", tt.body, got, tt.want)
			}
		})
	}
}
