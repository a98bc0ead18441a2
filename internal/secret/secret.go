// Package secret reads the secrets kvroute sends in HTTP headers (an engine's API key,
// the replicas' shared token) from files mounted for it, such as a Kubernetes Secret.
package secret

import (
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
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

// envName is what an environment variable's name may be.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// CheckSources checks a key's two config sources, api_key_file and api_key_env: at
// most one set, and the variable's a name. Errors start with the key they concern.
func CheckSources(file, env string) error {
	if file != "" && env != "" {
		return errors.New("api_key_file: only one of api_key_file and api_key_env may be set")
	}
	if env != "" && !envName.MatchString(env) {
		return fmt.Errorf("api_key_env: want an environment variable name (letters, digits and _, not starting with a digit), got %q", env)
	}
	return nil
}

// Read returns the key its config sources give (CheckSources): the file's secret
// (ReadFile, re-read at each call so a rotated Secret applies) or the environment
// variable's value without surrounding whitespace; "" when neither is set. Errors
// start with the key they concern and never quote the secret.
func Read(file, env string) (string, error) {
	var key, source string
	switch {
	case file != "":
		source = "api_key_file"
		var err error
		if key, err = ReadFile(file); err != nil {
			return "", fmt.Errorf("%s: %w", source, err)
		}
	case env != "":
		source = "api_key_env"
		v, ok := os.LookupEnv(env)
		if key = strings.TrimSpace(v); !ok || key == "" {
			return "", fmt.Errorf("%s: the environment variable %s is not set or empty", source, env)
		}
		if err := CheckHeaderValue(key); err != nil { // ReadFile checked the file's
			return "", fmt.Errorf("%s: %w", source, err)
		}
	default:
		return "", nil
	}
	return key, nil
}
