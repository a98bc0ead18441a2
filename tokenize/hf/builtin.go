package hf

import (
	"fmt"

	"github.com/kvroute/kvroute/tokenize/builtin"
)

// LoadBuiltin builds the tokenizer of an embedded model (see package builtin; "qwen3")
// with [DefaultConfig].
func LoadBuiltin(name string) (*Tokenizer, error) {
	data, err := builtin.TokenizerJSON(name)
	if err != nil {
		return nil, err
	}
	t, err := Parse(data, DefaultConfig())
	if err != nil {
		return nil, fmt.Errorf("builtin %s: %w", name, err)
	}
	return t, nil
}
