package enginemodels

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// MaxModels bounds the cards one page may list: an engine serves a base model and up
// to its --max-cpu-loras adapters, hundreds at most. A longer list is refused whole:
// kvroute keeps what it reads, so a hostile page must not size its memory.
const MaxModels = 10000

// MaxNameBytes bounds a model's or adapter's name, as kvroute's own config does.
const MaxNameBytes = 512

// ErrBadList is wrapped by the error for a page that is JSON but not a model list an
// engine would send: too many cards, an unnamed or oversized one, a name with control
// characters.
var ErrBadList = errors.New("untrustworthy model list")

// List is what one engine's /v1/models says it serves.
type List struct {
	// Adapters maps each LoRA adapter the engine has loaded to its base model (the
	// card's parent). Base models (cards without a parent) are not in it.
	Adapters map[string]string
}

// Parse reads an OpenAI-compatible model list ({"object": "list", "data": [{"id": …,
// "parent": …}, …]}, as vLLM's and SGLang's /v1/models answer): a card with a parent
// is a LoRA adapter of that base model (vLLM lists --lora-modules and adapters loaded at
// run time this way), a card without one a base model. A card listed twice keeps its
// first parent. Unknown fields are ignored.
func Parse(page []byte) (List, error) {
	var doc struct {
		Data *[]struct {
			ID     *string `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.Unmarshal(page, &doc); err != nil {
		return List{}, fmt.Errorf("model list: %w", err)
	}
	if doc.Data == nil {
		return List{}, fmt.Errorf("%w: no data array", ErrBadList)
	}
	cards := *doc.Data
	if len(cards) > MaxModels {
		return List{}, fmt.Errorf("%w: %d cards, more than %d", ErrBadList, len(cards), MaxModels)
	}
	list := List{Adapters: map[string]string{}}
	for i, c := range cards {
		if c.ID == nil {
			return List{}, fmt.Errorf("%w: data[%d] has no id", ErrBadList, i)
		}
		if err := checkName(*c.ID); err != nil {
			return List{}, fmt.Errorf("%w: data[%d].id: %v", ErrBadList, i, err)
		}
		if c.Parent == nil {
			continue
		}
		if err := checkName(*c.Parent); err != nil {
			return List{}, fmt.Errorf("%w: data[%d].parent: %v", ErrBadList, i, err)
		}
		if *c.Parent == *c.ID {
			return List{}, fmt.Errorf("%w: data[%d]: %q names itself as its parent", ErrBadList, i, *c.ID)
		}
		if _, seen := list.Adapters[*c.ID]; !seen {
			list.Adapters[*c.ID] = *c.Parent
		}
	}
	return list, nil
}

// checkName refuses a name no engine would give a model: empty, longer than
// MaxNameBytes, not UTF-8, or holding a control character (it reaches logs and the
// decision trace).
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("empty")
	case len(name) > MaxNameBytes:
		return fmt.Errorf("%d bytes, more than %d", len(name), MaxNameBytes)
	case !utf8.ValidString(name):
		return errors.New("not UTF-8")
	}
	for _, r := range name {
		if r < ' ' || r == 0x7f {
			return fmt.Errorf("control character %U", r)
		}
	}
	return nil
}
