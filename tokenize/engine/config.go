package engine

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/kvroute/kvroute/internal/secret"
)

// Config is a model's render endpoint (the tokenizers.<model>.engine key).
type Config struct {
	// URL is the render server's base URL (scheme, host, port, optional path prefix):
	// the client appends /v1/chat/completions/render or /v1/completions/render.
	URL string `yaml:"url"`
	// Timeout bounds one render, connection included; past it the request is routed by
	// load. It is added to the decision of every request of the model when the server
	// is slow, so keep it short.
	Timeout time.Duration `yaml:"timeout"`
	// MaxConcurrency bounds the renders in flight for the model; a request finding every
	// slot taken is routed by load at once instead of queueing.
	MaxConcurrency int `yaml:"max_concurrency"`
	// APIKeyFile is a file holding the render server's API key (vLLM's --api-key), sent
	// as "Authorization: Bearer KEY": e.g. a mounted Kubernetes Secret. It is read at
	// start and again at each config reload; white space around the key (a final
	// newline) is dropped. A file that cannot be read or holds no key is a config error.
	APIKeyFile string `yaml:"api_key_file,omitempty"`
	// APIKeyEnv is the name of an environment variable holding the key instead; it must
	// be set and not empty.
	APIKeyEnv string `yaml:"api_key_env,omitempty"`
}

// DefaultConfig returns a 100 ms timeout and 64 renders in flight; URL is required.
func DefaultConfig() Config { return Config{Timeout: 100 * time.Millisecond, MaxConcurrency: 64} }

// withDefaults fills the keys left at zero.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Timeout == 0 {
		c.Timeout = d.Timeout
	}
	if c.MaxConcurrency == 0 {
		c.MaxConcurrency = d.MaxConcurrency
	}
	return c
}

// Validate reports the first invalid key, naming it relative to the engine section
// ("url: …"); the caller prefixes the section's path.
func (c Config) Validate() error {
	if c.URL == "" {
		return errors.New("url: required (the render server's base URL, e.g. http://127.0.0.1:8000)")
	}
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("url: want an http:// or https:// base URL with a host and no query, got %q", c.URL)
	}
	if u.User != nil {
		return fmt.Errorf("url: must not carry credentials, got %q", u.Redacted())
	}
	if c.Timeout < 0 {
		return fmt.Errorf("timeout: must be > 0 (0: the default %s), got %s", DefaultConfig().Timeout, c.Timeout)
	}
	if c.MaxConcurrency < 0 {
		return fmt.Errorf("max_concurrency: must be > 0 (0: the default %d), got %d", DefaultConfig().MaxConcurrency, c.MaxConcurrency)
	}
	return secret.CheckSources(c.APIKeyFile, c.APIKeyEnv)
}

// ReadAPIKey returns the key APIKeyFile or APIKeyEnv holds, "" when neither is set.
// Errors name the key relative to the engine section ("api_key_file: …") and never
// quote the key.
func (c Config) ReadAPIKey() (string, error) { return secret.Read(c.APIKeyFile, c.APIKeyEnv) }
