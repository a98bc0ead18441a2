package openai

import (
	"errors"
	"testing"
)

// FuzzParseResponses feeds arbitrary bodies to ParseResponses: it never panics, every
// rejection is a *FieldError (a 400), an accepted body has a model and an id within
// bounds, the body is judged as ParseModel judges it, and the result is the same every
// time.
func FuzzParseResponses(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","input":"hi"}`,
		`{"model":"m","input":[{"role":"user","content":"more"}],"previous_response_id":"resp_1","store":true,"stream":true}`,
		`{"model":"m","previous_response_id":null,"store":null,"background":null,"stream":null}`,
		`{"model":"m","store":"no","background":1,"stream":"yes"}`,
		`{"model":"m","previous_response_id":"resp_1","previous_response_id":""}`,
		`{"model":"m","previous_response_id":"\ud800\u00e9"}`,
		`{"model":"m","previous_response_id":[1,{"a":[]}]}`,
		`{"model":"m","tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"instructions":"x"}`,
		`{"model":1}`, `{"model":""}`, `[]`, `{`, ``, ` `, `null`, `{"model":"m"} x`,
		`{"model":"m","input":[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		lim := Limits{MaxDepth: 16, MaxPromptTokens: 64}
		got, err := ParseResponses([]byte(body), lim)
		again, againErr := ParseResponses([]byte(body), lim)
		if got != again || (err == nil) != (againErr == nil) || err != nil && err.Error() != againErr.Error() {
			t.Fatalf("two parses differ: %+v, %v and %+v, %v", got, err, again, againErr)
		}
		model, modelErr := ParseModel([]byte(body), lim)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || !errors.Is(err, ErrBadRequest) {
				t.Fatalf("rejection is not a *FieldError: %v", err)
			}
			if modelErr != nil && err.Error() != modelErr.Error() {
				t.Fatalf("ParseResponses refused with %q, ParseModel with %q", err, modelErr)
			}
			return
		}
		switch {
		case got.Model == "":
			t.Fatal("accepted a body without a model")
		case modelErr != nil || model != got.Model:
			t.Fatalf("ParseResponses read model %q, ParseModel %q, %v", got.Model, model, modelErr)
		case len(got.PreviousResponseID) > MaxResponseIDBytes:
			t.Fatalf("accepted a previous id of %d bytes", len(got.PreviousResponseID))
		}
	})
}
