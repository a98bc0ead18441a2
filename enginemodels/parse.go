package enginemodels

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/kvroute/kvroute/internal/enginename"
)

// MaxModels bounds the cards one page may list: an engine serves a base model and up
// to its --max-cpu-loras adapters, hundreds at most. A longer list is refused whole:
// kvroute keeps what it reads, so a hostile page must not size its memory.
const MaxModels = 10000

// ErrBadList is wrapped by the error for a page that is JSON but not a model list an
// engine would send: too many cards, an unnamed or oversized one, a name with control
// characters.
var ErrBadList = errors.New("untrustworthy model list")

// List is what one engine's /v1/models says it serves.
type List struct {
	// Adapters maps each LoRA adapter the engine has loaded to its base model (the
	// card's parent).
	Adapters map[string]string
	// Bases are the base models it serves (cards without a parent), a set.
	Bases map[string]struct{}
	// ContextLengths maps each card that gives one to its max_model_len (vLLM's
	// --max-model-len, its context in tokens: a prompt of that many tokens or more is
	// refused). vLLM gives it on base-model cards; a value that is not a JSON integer in
	// [1, MaxContextLength] is left out, as if not given.
	ContextLengths map[string]int
}

// MaxContextLength bounds a card's max_model_len: 2³¹ − 1 tokens, over a hundred
// times the longest context served today, and a count an int holds on every platform.
const MaxContextLength = 1<<31 - 1

// Parse reads an OpenAI-compatible model list ({"object": "list", "data": [{"id": …,
// "parent": …}, …]}, as vLLM's and SGLang's /v1/models answer): a card with a parent
// is a LoRA adapter of that base model (vLLM lists --lora-modules and adapters loaded at
// run time this way), a card without one a base model. A card listed twice keeps its
// first parent and its first max_model_len. Unknown fields are ignored. The page is read as a stream, so a list
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
	list := List{Adapters: map[string]string{}, Bases: map[string]struct{}{}, ContextLengths: map[string]int{}}
	for i := 0; dec.More(); i++ {
		if i == MaxModels {
			return List{}, fmt.Errorf("%w: more than %d cards", ErrBadList, MaxModels)
		}
		var card struct {
			ID          *string         `json:"id"`
			Parent      *string         `json:"parent"`
			MaxModelLen json.RawMessage `json:"max_model_len"`
		}
		if err := dec.Decode(&card); err != nil {
			return List{}, fmt.Errorf("model list: data[%d]: %w", i, err)
		}
		if card.ID == nil {
			return List{}, fmt.Errorf("%w: data[%d] has no id", ErrBadList, i)
		}
		if err := enginename.Check(*card.ID); err != nil {
			return List{}, fmt.Errorf("%w: data[%d].id: %v", ErrBadList, i, err)
		}
		if n, ok := contextLength(card.MaxModelLen); ok {
			if _, seen := list.ContextLengths[*card.ID]; !seen {
				list.ContextLengths[*card.ID] = n
			}
		}
		if card.Parent == nil {
			list.Bases[*card.ID] = struct{}{}
			continue
		}
		if err := enginename.Check(*card.Parent); err != nil {
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

// contextLength reads a card's max_model_len: a JSON integer in [1,
// MaxContextLength], written as an integer (not 1e5, not 1.0, not a string). Anything
// else, null and absence included, is no length: it is the engine's to refuse prompts
// past its context, and a wrong length here would only send prompts elsewhere.
func contextLength(raw json.RawMessage) (int, bool) {
	n, err := strconv.ParseInt(string(bytes.TrimSpace(raw)), 10, 64)
	if err != nil || n < 1 || n > MaxContextLength {
		return 0, false
	}
	return int(n), true
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
