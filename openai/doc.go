// Package openai is step 3 of a routing decision (DESIGN §2): it reads an OpenAI API
// request body (chat completions or completions) into a protocol-free [Request], and a
// response's final usage object into [Usage]; a [ModelRenamer] gives a rewritten
// request's response the client's model name back. The filter, the simulated worker and
// `extproc tokenize` all read bodies through it, so they see the same prompt.
//
// Bodies come from clients and are hostile: parsing never panics, its memory is
// proportional to the body (token-id prompts decode straight into []uint32), nesting is
// bounded by [Limits.MaxDepth], and every rejection is a *FieldError naming the field.
// Everything here is safe for concurrent use, but a ModelRenamer, which serves one body.
package openai
