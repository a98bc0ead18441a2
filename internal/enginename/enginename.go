// Package enginename checks the names engines report of their models and LoRA
// adapters (a model list's ids, a metrics page's adapter labels): outside input that
// reaches logs, metrics pages' readers and the decision trace.
package enginename

import (
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// MaxBytes bounds a name: a model's path-like id is far shorter.
const MaxBytes = 512

// Check refuses a name no engine gives a model or an adapter: empty, longer than
// MaxBytes, not UTF-8, or holding a control or format character (C0, C1, bidi
// overrides, zero-width).
func Check(name string) error {
	switch {
	case name == "":
		return errors.New("empty")
	case len(name) > MaxBytes:
		return fmt.Errorf("%d bytes, more than %d", len(name), MaxBytes)
	case !utf8.ValidString(name):
		return errors.New("not UTF-8")
	}
	for _, r := range name {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return fmt.Errorf("control or format character %U", r)
		}
	}
	return nil
}
