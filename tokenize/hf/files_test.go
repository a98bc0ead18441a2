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
	"sync"
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
	top, err := splitObject(base)
	require.NoError(t, err)
	model, err := splitObject(top["model"])
	require.NoError(t, err)
	for key, value := range v.Set {
		if inner, ok := strings.CutPrefix(key, "model."); ok {
			model[inner] = value
		} else {
			top[key] = value
		}
	}
	top["model"] = joinObject(model)
	var added []json.RawMessage
	require.NoError(t, json.Unmarshal(top["added_tokens"], &added))
	added = append(added, v.AppendAddedTokens...)
	top["added_tokens"], err = json.Marshal(added)
	require.NoError(t, err)
	return joinObject(top)
}

// joinObject writes fields as a JSON object without re-encoding the values.
func joinObject(fields map[string]json.RawMessage) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	for k, v := range fields {
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		key, _ := json.Marshal(k)
		b.Write(key)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes()
}

// parsed caches each real file's tokenizer for the test binary: parsing the large files
// takes seconds under the race detector. loadModel hands out copies with their own memo.
var parsed sync.Map // name → *Tokenizer

// loadModel returns a real file's tokenizer with the memo of cfg. The copies share the
// model and its word cache, which hold only what every copy would compute alike.
func loadModel(t testing.TB, name string, cfg Config) *Tokenizer {
	t.Helper()
	base, ok := parsed.Load(name)
	if !ok {
		tok, err := Parse(modelFile(t, name), DefaultConfig())
		require.NoError(t, err)
		base, _ = parsed.LoadOrStore(name, tok)
	}
	tok := *base.(*Tokenizer)
	tok.memo = newMemo(cfg.MemoBytes)
	return &tok
}

// loadVariant is loadModel for a variant (parsed once per test binary too).
func loadVariant(t testing.TB, v variant, cfg Config) *Tokenizer {
	t.Helper()
	key := "variant:" + v.Name
	base, ok := parsed.Load(key)
	if !ok {
		tok, err := Parse(v.apply(t, modelFile(t, v.Base)), DefaultConfig())
		require.NoError(t, err, v.About)
		base, _ = parsed.LoadOrStore(key, tok)
	}
	tok := *base.(*Tokenizer)
	tok.memo = newMemo(cfg.MemoBytes)
	return &tok
}
