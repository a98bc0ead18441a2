// Package jsonv parses JSON from outside the process (request bodies, response usage)
// into ordered values, under a nesting limit. It owns no step of the decision path: the
// filter uses it to read an OpenAI request into a protocol-free request, and the chat
// renderer reads the ordered values it produces (a template's tojson must keep the
// request's key order, which map-based decoders lose).
//
// Its memory is proportional to what the caller materialises (a [Value] is 16 bytes, a
// value's tree is allocated at exactly its size, and skipped values cost nothing), it
// can be capped ([Decoder.SetValueBudget]), and its recursion is bounded by the depth
// limit, so a hostile body can exhaust neither the heap nor the goroutine stack.
// Token-id arrays decode straight into []uint32 ([Decoder.AppendUint32s]).
package jsonv
