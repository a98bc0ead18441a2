// Package secret reads the secrets kvroute sends in HTTP headers (an engine's API key,
// the replicas' shared token) from files mounted for it, such as a Kubernetes Secret.
package secret

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// MaxFileBytes bounds a secret's file: a larger one holds no secret and is refused,
// not cut.
const MaxFileBytes = 4 << 10

// ReadFile returns the secret in the file at path: its content without surrounding
// whitespace. It refuses a file larger than MaxFileBytes, an empty one, and a secret
// an HTTP header cannot carry ([CheckHeaderValue]). Errors name the file and never
// quote its content.
func ReadFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return "", err
	}
	if len(b) > MaxFileBytes {
		return "", fmt.Errorf("%s is larger than %d bytes: not a key or token", path, MaxFileBytes)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, CheckHeaderValue(s)
}

// errControl is CheckHeaderValue's refusal.
var errControl = errors.New("the value holds a control character, which an HTTP header cannot carry")

// CheckHeaderValue refuses a secret holding a control character (a line break, a NUL,
// DEL): an HTTP header cannot carry it.
func CheckHeaderValue(s string) error {
	for _, b := range []byte(s) {
		if b < ' ' || b == 0x7f {
			return errControl
		}
	}
	return nil
}
