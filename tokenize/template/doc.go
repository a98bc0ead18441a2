// Package template is the exact chat renderer of step 4 of a routing decision (DESIGN
// §2): it renders a chat with the model's own Jinja chat template into the prompt text
// the engine tokenizes, as vLLM does with a Hugging Face tokenizer.
//
// A [Renderer] is built from a model's tokenizer_config.json (its chat_template, a string
// or a list of named templates, and its special tokens) and an optional
// chat_template.jinja, which takes precedence as in transformers ([FromConfigFile]), or
// from a template source ([New]). It implements [tokenize.ChatRenderer] and reproduces:
//
//   - vLLM's message preprocessing: each message is rebuilt from its role, content,
//     tool_calls, reasoning, tool_call_id, name and task; text content parts are joined
//     with "\n" (or kept as {"type": "text", "text": …} parts when the template loops over
//     a message's content, vLLM's "openai" content format, detected as vLLM does);
//     tool-call arguments are parsed from JSON strings into objects; an empty tool_calls
//     list is dropped; tools are re-shaped as vLLM's pydantic model_dump shapes them.
//   - transformers' Jinja environment: trim_blocks, lstrip_blocks, loopcontrols, a tojson
//     that behaves like Python's json.dumps(ensure_ascii=False) with the request's key
//     order, raise_exception (an error wrapping [ErrTemplate], which callers map to a
//     client error) and strftime_now (from an injected clock).
//   - the variables messages, tools, documents, add_generation_prompt, the special
//     tokens and chat_template_kwargs (which override the others, as in vLLM), and
//     transformers' continue_final_message cut.
//
// Rendering uses github.com/ardanlabs/jinja, except for the chats a direct renderer
// takes: Go written for one template's exact source (by SHA-256; today Qwen3's,
// Llama 3.1 Instruct's, which Llama 3.3 Instruct shares, Llama 3.2 Instruct's, whose
// date comes from the injected clock as strftime_now's does, and the original Llama 3
// Instruct's, which reads only roles and contents and so also takes tools and tool
// calls), used for the inputs it handles and held to the library by a differential fuzz
// test. Templates are
// configuration, trusted like code; chats are hostile: a render never panics (panics
// inside the library become errors), range() is bounded, output is capped (tojson,
// bound to kvroute's own filter at compile, measures its output against the cap before
// building it, so a pretty-printed tool cannot amplify a render's memory), and nesting
// is bounded by the request parser's depth limit. Media content parts (images, audio, video) are refused with
// [ErrUnsupportedContent]: their placeholders are model-specific.
//
// A Renderer is immutable after construction and safe for concurrent use; templates are
// compiled once, at load.
package template
