// Package templatecorpus reads, for tests, the chat templates of the golden tests'
// corpus (tokenize/template/testdata/templates/ollama.json.gz, ollama-utils'), from any
// package: the tokenizer's, the router's and the parser's tests each need one.
package templatecorpus

import (
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// Template is one template of the corpus: the ollama model it is of, and its source.
type Template struct{ Model, Template string }

// All returns the corpus's templates in order, failing tb if they cannot be read.
func All(tb testing.TB) []Template {
	tb.Helper()
	_, self, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(self), "..", "..", "tokenize", "template", "testdata", "templates", "ollama.json.gz")
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		tb.Fatal(err)
	}
	var file struct {
		Templates []Template `json:"templates"`
	}
	if err := json.NewDecoder(zr).Decode(&file); err != nil {
		tb.Fatal(err)
	}
	return file.Templates
}

// Ollama returns the source of the corpus template of model (e.g.
// "library/granite4:latest"), failing tb if it is not there.
func Ollama(tb testing.TB, model string) string {
	tb.Helper()
	for _, e := range All(tb) {
		if e.Model == model {
			return e.Template
		}
	}
	tb.Fatalf("no template %s in ollama.json.gz", model)
	return ""
}
