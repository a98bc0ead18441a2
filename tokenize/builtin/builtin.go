package builtin

import (
	"bytes"
	"compress/gzip"
	"embed"
	"fmt"
	"io"
	"io/fs"
	"sort"
)

//go:embed qwen3/tokenizer.json.gz qwen3/tokenizer_config.json.gz
var files embed.FS

// Names returns the names of the embedded models, sorted.
func Names() []string {
	entries, _ := fs.ReadDir(files, ".")
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

// TokenizerJSON returns the named model's tokenizer.json. Each call decompresses a fresh
// copy, which belongs to the caller.
func TokenizerJSON(name string) ([]byte, error) { return read(name, "tokenizer.json") }

// TokenizerConfigJSON returns the named model's tokenizer_config.json (chat template,
// special tokens). Each call decompresses a fresh copy, which belongs to the caller.
func TokenizerConfigJSON(name string) ([]byte, error) { return read(name, "tokenizer_config.json") }

func read(name, file string) ([]byte, error) {
	gz, err := files.ReadFile(name + "/" + file + ".gz")
	if err != nil || name == "" || name == "." {
		return nil, fmt.Errorf("builtin: no embedded model %q (have %v)", name, Names())
	}
	r, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, fmt.Errorf("builtin: %s/%s: %w", name, file, err)
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("builtin: %s/%s: %w", name, file, err)
	}
	return data, nil
}
