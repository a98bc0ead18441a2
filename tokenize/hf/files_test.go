package hf

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/tokenize/builtin"
)

// tokenizerDirEnv names a directory holding <name>/tokenizer.json for the models whose
// files are not committed (their licences do not allow it): llama3_1, gemma3,
// deepseek_v3. testdata/gen/README.md shows how to fill it.
const tokenizerDirEnv = "KVROUTE_TOKENIZER_DIR"

// committedModels are the real tokenizer files in the repository.
var committedModels = map[string]func() ([]byte, error){
	"qwen3":     func() ([]byte, error) { return builtin.TokenizerJSON("qwen3") },
	"mistral7b": func() ([]byte, error) { return gunzipFile("testdata/models/mistral7b/tokenizer.json.gz") },
	"gptoss":    func() ([]byte, error) { return gunzipFile("testdata/models/gptoss/tokenizer.json.gz") },
}

func gunzipFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	return io.ReadAll(r)
}

// modelFile returns a real tokenizer.json: committed, or from $KVROUTE_TOKENIZER_DIR
// (the test is skipped, saying so, when that is unset or lacks the file).
func modelFile(t testing.TB, name string) []byte {
	t.Helper()
	if load, ok := committedModels[name]; ok {
		data, err := load()
		require.NoError(t, err)
		return data
	}
	dir := os.Getenv(tokenizerDirEnv)
	if dir == "" {
		t.Skipf("%s's tokenizer.json is not committed (licence); set %s to a directory holding %s/tokenizer.json to run these cases", name, tokenizerDirEnv, name)
	}
	data, err := os.ReadFile(filepath.Join(dir, name, "tokenizer.json"))
	if os.IsNotExist(err) {
		t.Skipf("%s: no %s/tokenizer.json in %s=%s", name, name, tokenizerDirEnv, dir)
	}
	require.NoError(t, err)
	return data
}

// goldenHeader is the first line of a golden file.
type goldenHeader struct {
	Tokenizer string `json:"tokenizer"`
	Source    string `json:"source"`
	Reference string `json:"reference"`
	SHA256    string `json:"sha256"`
	Base      string `json:"base"`
}

// goldenCase is an input and the library's ids for it, without and (for some cases)
// with special tokens.
type goldenCase struct {
	Name       string   `json:"name"`
	Text       string   `json:"text"`
	IDs        []uint32 `json:"ids"`
	IDsSpecial []uint32 `json:"ids_special"`
}

func readGolden(t testing.TB, name string) (goldenHeader, []goldenCase) {
	t.Helper()
	data, err := gunzipFile(filepath.Join("testdata", "golden", name+".jsonl.gz"))
	require.NoError(t, err)
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 16<<20)
	require.True(t, sc.Scan())
	var h goldenHeader
	require.NoError(t, json.Unmarshal(sc.Bytes(), &h))
	var cases []goldenCase
	for sc.Scan() {
		var c goldenCase
		require.NoError(t, json.Unmarshal(sc.Bytes(), &c))
		if c.IDs == nil {
			c.IDs = []uint32{}
		}
		cases = append(cases, c)
	}
	require.NoError(t, sc.Err())
	return h, cases
}

func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// variant is an entry of testdata/variants.json: a committed base file with fields
// replaced (dotted keys reach into objects) and added tokens appended, exactly as the
// generator built it.
type variant struct {
	Name              string                     `json:"name"`
	Base              string                     `json:"base"`
	About             string                     `json:"about"`
	Set               map[string]json.RawMessage `json:"set"`
	AppendAddedTokens []json.RawMessage          `json:"append_added_tokens"`
}

func readVariants(t testing.TB) []variant {
	t.Helper()
	data, err := os.ReadFile("testdata/variants.json")
	require.NoError(t, err)
	var vs []variant
	require.NoError(t, json.Unmarshal(data, &vs))
	return vs
}

func (v variant) apply(t testing.TB, base []byte) []byte {
	t.Helper()
	var top map[string]any
	dec := json.NewDecoder(bytes.NewReader(base))
	dec.UseNumber()
	require.NoError(t, dec.Decode(&top))
	for key, raw := range v.Set {
		var value any
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		require.NoError(t, d.Decode(&value))
		parts := strings.Split(key, ".")
		o := top
		for _, p := range parts[:len(parts)-1] {
			o = o[p].(map[string]any)
		}
		o[parts[len(parts)-1]] = value
	}
	added, _ := top["added_tokens"].([]any)
	for _, raw := range v.AppendAddedTokens {
		var tok map[string]any
		require.NoError(t, json.Unmarshal(raw, &tok))
		added = append(added, tok)
	}
	top["added_tokens"] = added
	out, err := json.Marshal(top)
	require.NoError(t, err)
	return out
}

// loadModel parses a real tokenizer.json with cfg.
func loadModel(t testing.TB, name string, cfg Config) *Tokenizer {
	t.Helper()
	tok, err := Parse(modelFile(t, name), cfg)
	require.NoError(t, err)
	return tok
}
