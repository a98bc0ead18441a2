package tokenize

// API is the HTTP API a request body is written for ([Prompt.BodyAPI]): it names the
// render endpoint an encoder that asks the engine posts the body to. Encoders that
// compute the prompt themselves ignore it.
type API uint8

const (
	// APIFromPrompt, the zero value, says the body is a chat completions one when the
	// prompt is a Chat, a completions one otherwise.
	APIFromPrompt API = iota
	// APIChat is a chat completions body (POST /v1/chat/completions).
	APIChat
	// APICompletions is a completions body (POST /v1/completions).
	APICompletions
	// APIResponses is an OpenAI Responses API body (POST /v1/responses) that names no
	// stored response (vLLM's render of it is stateless).
	APIResponses
	// APIMessages is an Anthropic Messages API body (POST /v1/messages).
	APIMessages
	// APIGenerate is a body of vLLM's token-in/token-out API (POST
	// /inference/v1/generate): its prompt is token ids, which no encoder renders.
	APIGenerate
	// APISGLang is a body of SGLang's native generate API (POST /generate): its prompt
	// is text encoded as a completions prompt, or token ids; no engine renders it.
	APISGLang
	// APISGLangCloseSession is a body of SGLang's POST /close_session: it names the
	// session to close, and holds no prompt.
	APISGLangCloseSession
	// APISGLangOpenSession is a body of SGLang's POST /open_session: it may name the
	// session it opens, and holds no prompt.
	APISGLangOpenSession
)

// Of returns the API a body with prompt p is for: a itself, or for APIFromPrompt the
// one p's prompt says.
func (a API) Of(p Prompt) API {
	switch {
	case a != APIFromPrompt:
		return a
	case p.Chat != nil:
		return APIChat
	}
	return APICompletions
}

// String returns the API's name: "chat", "completions", "responses", "messages",
// "generate", "sglang_generate", "sglang_close_session", "sglang_open_session", or
// "from_prompt" for the zero value.
func (a API) String() string {
	switch a {
	case APIChat:
		return "chat"
	case APICompletions:
		return "completions"
	case APIResponses:
		return "responses"
	case APIMessages:
		return "messages"
	case APIGenerate:
		return "generate"
	case APISGLang:
		return "sglang_generate"
	case APISGLangCloseSession:
		return "sglang_close_session"
	case APISGLangOpenSession:
		return "sglang_open_session"
	case APIFromPrompt:
		return "from_prompt"
	}
	return "unknown"
}
