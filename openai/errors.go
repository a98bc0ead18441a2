package openai

import (
	"errors"
	"fmt"
)

// ErrBadRequest is wrapped by every error of this package: the client's request is
// malformed (HTTP 400).
var ErrBadRequest = errors.New("bad request")

// FieldError is a client error about one request field: Param is the OpenAI error's
// param (the field's name, "" for the body as a whole).
type FieldError struct {
	Param string
	Msg   string
}

func (e *FieldError) Error() string { return e.Msg }

// Unwrap makes every FieldError an [ErrBadRequest].
func (e *FieldError) Unwrap() error { return ErrBadRequest }

func badField(param, format string, args ...any) error {
	return &FieldError{Param: param, Msg: fmt.Sprintf(format, args...)}
}
