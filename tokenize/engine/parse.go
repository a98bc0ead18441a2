package engine

import (
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/jsonv"
)

// maxReplyDepth bounds the nesting of a render reply: token_ids sits at depth 2 (3 in a
// completions reply); sampling_params and features nest a little deeper.
const maxReplyDepth = 32

// maxID bounds a token id: vocabularies are far smaller, and ids at or above 2^31 are
// what a corrupt or hostile reply would carry into the block hashes.
const maxID = 1<<31 - 1

// ParseChatRender reads the token ids of a /v1/chat/completions/render reply: vLLM's
// GenerateRequest object, {"request_id": …, "token_ids": [ids…], "features": …,
// "sampling_params": {…}, "model": …, …}. Other members are skipped (their syntax is
// still checked). It fails on malformed JSON, a missing or empty token_ids, more than
// maxTokens ids and an id above 2^31-1.
func ParseChatRender(body []byte, maxTokens int) ([]uint32, error) {
	return parseOne("chat", body, maxTokens)
}

// ParseResponsesRender reads the token ids of a /v1/responses/render reply: one
// GenerateRequest object, as a chat render's (vLLM's ServingRender
// render_responses_request), read as [ParseChatRender] reads it.
func ParseResponsesRender(body []byte, maxTokens int) ([]uint32, error) {
	return parseOne("responses", body, maxTokens)
}

// ParseMessagesRender reads the token ids of a /v1/messages/render reply: one
// GenerateRequest object, as a chat render's, read as [ParseChatRender] reads it.
func ParseMessagesRender(body []byte, maxTokens int) ([]uint32, error) {
	return parseOne("messages", body, maxTokens)
}

// parseOne reads a reply of one GenerateRequest object; api names the endpoint in its
// errors.
func parseOne(api string, body []byte, maxTokens int) ([]uint32, error) {
	dec := jsonv.NewDecoder(body, maxReplyDepth)
	ids, err := generateRequest(dec, maxTokens)
	if err == nil {
		err = dec.End()
	}
	if err != nil {
		return nil, fmt.Errorf("%s render reply: %w", api, err)
	}
	return ids, nil
}

// ParseCompletionsRender reads the token ids of a /v1/completions/render reply: a list
// of GenerateRequest objects, one per prompt of the request. The router routes a batch
// by its first prompt (as it reads the request), so the ids are the first object's;
// the others are only syntax-checked. An empty list is an error.
func ParseCompletionsRender(body []byte, maxTokens int) ([]uint32, error) {
	dec := jsonv.NewDecoder(body, maxReplyDepth)
	var ids []uint32
	err := expect(dec, jsonv.Array)
	if err == nil {
		err = dec.Elements(func(i int) error {
			if i > 0 {
				return dec.Skip()
			}
			var err error
			ids, err = generateRequest(dec, maxTokens)
			return err
		})
	}
	if err == nil && ids == nil {
		err = errors.New("an empty list")
	}
	if err == nil {
		err = dec.End()
	}
	if err != nil {
		return nil, fmt.Errorf("completions render reply: %w", err)
	}
	return ids, nil
}

// generateRequest reads one GenerateRequest object's token_ids.
func generateRequest(dec *jsonv.Decoder, maxTokens int) ([]uint32, error) {
	if err := expect(dec, jsonv.Object); err != nil {
		return nil, err
	}
	var ids []uint32
	seen := false
	err := dec.Members(func(key string) error {
		if key != "token_ids" {
			return dec.Skip()
		}
		if seen {
			return errors.New("token_ids given twice")
		}
		seen = true
		if err := expect(dec, jsonv.Array); err != nil {
			return fmt.Errorf("token_ids: %w", err)
		}
		var err error
		if ids, err = dec.AppendUint32s(make([]uint32, 0, 256), maxTokens); err != nil {
			return fmt.Errorf("token_ids: %w", err)
		}
		return nil
	})
	switch {
	case err != nil:
		return nil, err
	case !seen:
		return nil, errors.New("no token_ids")
	case len(ids) == 0:
		return nil, errors.New("token_ids is empty")
	}
	for i, id := range ids {
		if id > maxID {
			return nil, fmt.Errorf("token_ids[%d]: %d is not a token id (above 2^31-1)", i, id)
		}
	}
	return ids, nil
}

// expect checks the kind of the next value without consuming it.
func expect(dec *jsonv.Decoder, want jsonv.Kind) error {
	k, err := dec.Peek()
	if err != nil {
		return err
	}
	if k != want {
		return fmt.Errorf("want an %s, got %s", want, k)
	}
	return nil
}
