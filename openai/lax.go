package openai

import (
	"math"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/jsonv"
)

// vLLM validates its requests with pydantic in lax mode, which converts some values of
// the wrong JSON type instead of refusing them: a client whose "max_tokens": 100.0 or
// "stream": 1 an engine serves must be served through kvroute too. laxBool and laxInt
// accept what pydantic v2's lax mode accepts for a bool and an int field (its
// conversion table; pydantic-core's str_as_bool, str_as_int and float_as_int), and
// nothing else.

// laxBool reads v as a pydantic bool field: true and false, the numbers 0 and 1 (also
// written 0.0 and 1.0), and the strings "0" and "1" and, in any case, f, n, no, off,
// false, t, y, on, yes and true.
func laxBool(v jsonv.Value) (value, ok bool) {
	switch v.Kind() {
	case jsonv.True, jsonv.False:
		return v.Bool(), true
	case jsonv.Number:
		switch f, ok := v.Float(); {
		case ok && f == 0:
			return false, true
		case ok && f == 1:
			return true, true
		}
	case jsonv.String:
		s := v.Str()
		if s == "0" || s == "1" {
			return s == "1", true
		}
		switch strings.ToLower(s) {
		case "f", "n", "no", "off", "false":
			return false, true
		case "t", "y", "on", "yes", "true":
			return true, true
		}
	}
	return false, false
}

// laxInt reads v as a pydantic int field: an integer, a finite number without a
// fractional part (100.0, 1e3), a string holding a decimal integer (surrounding
// whitespace, a sign, leading zeros, single underscores between digits and a fraction
// of zeros allowed: " +1_000.00 "), or true and false (1 and 0). Python's ints have no
// bound; one beyond int64 is read as the nearest int64, which no count kvroute reads
// can tell apart.
func laxInt(v jsonv.Value) (int64, bool) {
	switch v.Kind() {
	case jsonv.True:
		return 1, true
	case jsonv.False:
		return 0, true
	case jsonv.Number:
		if n, ok := v.Int(); ok {
			return n, true
		}
		if v.IsInteger() { // an integer literal past int64
			return saturate(strings.HasPrefix(v.Str(), "-")), true
		}
		f, ok := v.Float()
		if !ok || math.IsInf(f, 0) || math.IsNaN(f) || f != math.Trunc(f) {
			return 0, false
		}
		if f >= math.MaxInt64 || f <= math.MinInt64 {
			return saturate(f < 0), true
		}
		return int64(f), true
	case jsonv.String:
		return intString(v.Str())
	}
	return 0, false
}

// laxTokenID reads v as an element of vLLM's token-id prompt (list[int], its ints at
// least 0) in pydantic's lax mode, range-checked as every token id kvroute reads: an
// integer in [0, 2³²) written as laxInt reads one (1.0, 1e2, "1", true).
func laxTokenID(v jsonv.Value) (uint32, bool) {
	n, ok := laxInt(v)
	if !ok || n < 0 || n > math.MaxUint32 {
		return 0, false
	}
	return uint32(n), true
}

// intString parses s as pydantic's str_as_int does (see laxInt).
func intString(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	if whole, fraction, found := strings.Cut(s, "."); found {
		if fraction == "" || strings.Trim(fraction, "0") != "" {
			return 0, false
		}
		s = whole
	}
	negative := false
	if s != "" && (s[0] == '+' || s[0] == '-') {
		negative = s[0] == '-'
		s = s[1:]
	}
	if s == "" || s[0] == '_' || s[len(s)-1] == '_' || strings.Contains(s, "__") {
		return 0, false
	}
	digits := strings.ReplaceAll(s, "_", "")
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	switch {
	case err != nil || (!negative && n > math.MaxInt64) || (negative && n > 1<<63):
		return saturate(negative), true // only digits: the error is the range
	case negative:
		return int64(-n), true
	}
	return int64(n), true
}

// saturate returns the int64 nearest to an integer past its range.
func saturate(negative bool) int64 {
	if negative {
		return math.MinInt64
	}
	return math.MaxInt64
}
