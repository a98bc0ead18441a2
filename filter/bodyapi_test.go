package filter_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/filter"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/tokenize"
)

// TestConvertedBodiesComeAlongForTheEngine: a Messages or Responses body routed on its
// rebuilt chat carries itself and its API, for a model whose engine renders it
// (/v1/messages/render, /v1/responses/render); a Responses body naming a stored
// response carries none (vLLM's render refuses it), nor does a body not rebuilt (routed
// by load).
func TestConvertedBodiesComeAlongForTheEngine(t *testing.T) {
	lim := openai.DefaultLimits()
	messages := []byte(`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`)
	parsedM, err := openai.ParseMessages(messages, lim)
	require.NoError(t, err)
	req, err := filter.MessagesRouteRequest(parsedM, messages, lim)
	require.NoError(t, err)
	require.NotNil(t, req.Chat)
	assert.True(t, req.Rebuilt)
	assert.Equal(t, messages, req.Body)
	assert.Equal(t, tokenize.APIMessages, req.BodyAPI)

	responses := []byte(`{"model":"m","input":"hi","store":false}`)
	parsedR, err := openai.ParseResponses(responses, lim)
	require.NoError(t, err)
	req, err = filter.ResponsesRouteRequest(parsedR, responses, lim)
	require.NoError(t, err)
	require.NotNil(t, req.Chat)
	assert.Equal(t, responses, req.Body)
	assert.Equal(t, tokenize.APIResponses, req.BodyAPI)

	stored := []byte(`{"model":"m","input":"hi","previous_response_id":"resp_1"}`)
	parsedR, err = openai.ParseResponses(stored, lim)
	require.NoError(t, err)
	req, _ = filter.ResponsesRouteRequest(parsedR, stored, lim)
	assert.Nil(t, req.Body)
	assert.Equal(t, tokenize.APIFromPrompt, req.BodyAPI)

	image := []byte(`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}]}]}`)
	parsedM, err = openai.ParseMessages(image, lim)
	require.NoError(t, err)
	req, err = filter.MessagesRouteRequest(parsedM, image, lim)
	require.Error(t, err)
	assert.Nil(t, req.Body, "not rebuilt: routed by load, whatever the model")
	assert.Equal(t, []uint32{}, req.Tokens)
}
