package enginemodels

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode"
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
	// card's parent).
	Adapters map[string]string
	// Bases are the base models it serves (cards without a parent).
	Bases []string
}

// Parse reads an OpenAI-compatible model list ({"object": "list", "data": [{"id": …,
// "parent": …}, …]}, as vLLM's and SGLang's /v1/models answer): a card with a parent
// is a LoRA adapter of that base model (vLLM lists --lora-modules and adapters loaded at
// run time this way), a card without one a base model. A card listed twice keeps its
// first parent. Unknown fields are ignored. The page is read as a stream, so a list
// longer than MaxModels is refused before its cards are held.
func Parse(page []byte) (List, error) {
	dec := json.NewDecoder(bytes.NewReader(page))
	if err := expectDelim(dec, '{'); err != nil {
		return List{}, err
	}
	var list List
	seenData := false
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return List{}, fmt.Errorf("model list: %w", err)
		}
		if key != "data" {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return List{}, fmt.Errorf("model list: %w", err)
			}
			continue
		}
		if seenData {
			return List{}, fmt.Errorf("%w: data twice", ErrBadList)
		}
		seenData = true
		if list, err = parseCards(dec); err != nil {
			return List{}, err
		}
	}
	if err := expectDelim(dec, '}'); err != nil {
		return List{}, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return List{}, errors.New("model list: data after the object")
	}
	if !seenData {
		return List{}, fmt.Errorf("%w: no data array", ErrBadList)
	}
	return list, nil
}

// parseCards reads the data array's cards, at most MaxModels of them.
func parseCards(dec *json.Decoder) (List, error) {
	if err := expectDelim(dec, '['); err != nil {
		return List{}, err
	}
	list := List{Adapters: map[string]string{}}
	bases := map[string]bool{} // a set: a page may list thousands
	for i := 0; dec.More(); i++ {
		if i == MaxModels {
			return List{}, fmt.Errorf("%w: more than %d cards", ErrBadList, MaxModels)
		}
		var card struct {
			ID     *string `json:"id"`
			Parent *string `json:"parent"`
		}
		if err := dec.Decode(&card); err != nil {
			return List{}, fmt.Errorf("model list: data[%d]: %w", i, err)
		}
		if card.ID == nil {
			return List{}, fmt.Errorf("%w: data[%d] has no id", ErrBadList, i)
		}
		if err := checkName(*card.ID); err != nil {
			return List{}, fmt.Errorf("%w: data[%d].id: %v", ErrBadList, i, err)
		}
		if card.Parent == nil {
			if !bases[*card.ID] {
				bases[*card.ID] = true
				list.Bases = append(list.Bases, *card.ID)
			}
			continue
		}
		if err := checkName(*card.Parent); err != nil {
			return List{}, fmt.Errorf("%w: data[%d].parent: %v", ErrBadList, i, err)
		}
		if *card.Parent == *card.ID {
			return List{}, fmt.Errorf("%w: data[%d]: %q names itself as its parent", ErrBadList, i, *card.ID)
		}
		if _, seen := list.Adapters[*card.ID]; !seen {
			list.Adapters[*card.ID] = *card.Parent
		}
	}
	return list, expectDelim(dec, ']')
}

// expectDelim reads the next token and refuses anything but delim.
func expectDelim(dec *json.Decoder, delim json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("model list: %w", err)
	}
	if tok != delim {
		return fmt.Errorf("model list: %v where %v was due", tok, delim)
	}
	return nil
}

// checkName refuses a name no engine would give a model: empty, longer than
// MaxNameBytes, not UTF-8, or holding a control or format character (C0, C1, bidi
// overrides, zero-width: the name reaches logs and the decision trace).
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
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return fmt.Errorf("control or format character %U", r)
		}
	}
	return nil
}
