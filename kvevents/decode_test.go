package kvevents

import (
	"encoding/binary"
	"math"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/kvroute/kvroute/index"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The golden payloads below are written byte by byte from the msgpack spec and the
// layouts of KV_EVENTS.md, not produced by this package's encoder.

// fixstr is a msgpack fixstr (0xa0 | length, then the bytes).
func fixstr(s string) []byte { return append([]byte{0xa0 | byte(len(s))}, s...) }

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func f64(v float64) []byte { return binary.BigEndian.AppendUint64([]byte{0xcb}, math.Float64bits(v)) }

// goldenArrayBatch: [1.5, [stored, removed, cleared], 0], every event in array form.
var goldenArrayBatch = cat(
	[]byte{0x93}, f64(1.5), // batch: fixarray(3), ts
	[]byte{0x93}, // events: fixarray(3)
	// ["BlockStored", [0x1111, 0x2222], nil, [1,2,3,4], 2, nil, "GPU"]  (an older engine: six fields)
	[]byte{0x97}, fixstr("BlockStored"),
	[]byte{0x92, 0xcd, 0x11, 0x11, 0xcd, 0x22, 0x22}, // block_hashes: uint16, uint16
	[]byte{0xc0},                         // parent_block_hash: nil
	[]byte{0x94, 0x01, 0x02, 0x03, 0x04}, // token_ids
	[]byte{0x02},                         // block_size
	[]byte{0xc0},                         // lora_id: nil
	fixstr("GPU"),                        // medium
	// ["BlockRemoved", [0x2222], "GPU"]
	[]byte{0x93}, fixstr("BlockRemoved"), []byte{0x91, 0xcd, 0x22, 0x22}, fixstr("GPU"),
	// ["AllBlocksCleared"]
	[]byte{0x91}, fixstr("AllBlocksCleared"),
	[]byte{0x00}, // data_parallel_rank: 0
)

// goldenMapBatch: [2.0, [stored, removed]] without a rank, events as maps with unknown
// keys, a parent sent as 0, signed and byte-string hashes, extra keys carrying a LoRA
// name and a cache salt, and a sliding-window group.
var goldenMapBatch = cat(
	[]byte{0x92}, f64(2.0), []byte{0x92},
	// {"type":"BlockStored","block_hashes":[-1, bin8(9 bytes)],"parent_block_hash":0,
	//  "token_ids":[7,8,9,10],"block_size":2,"lora_name":"sql","extra_keys":[["sql","tenant"],["sql"]],
	//  "future_field":{"a":[1]},"medium":nil}
	[]byte{0x89},
	fixstr("type"), fixstr("BlockStored"),
	fixstr("block_hashes"), []byte{0x92, 0xff, 0xc4, 0x09, 0xaa, 0, 0, 0, 0, 0, 0, 0, 0x05},
	fixstr("parent_block_hash"), []byte{0x00},
	fixstr("token_ids"), []byte{0x94, 0x07, 0x08, 0x09, 0x0a},
	fixstr("block_size"), []byte{0x02},
	fixstr("lora_name"), fixstr("sql"),
	fixstr("extra_keys"), []byte{0x92, 0x92}, fixstr("sql"), fixstr("tenant"), []byte{0x91}, fixstr("sql"),
	fixstr("future_field"), []byte{0x81}, fixstr("a"), []byte{0x91, 0x01},
	fixstr("medium"), []byte{0xc0},
	// {"type":"BlockStored","block_hashes":[5],"parent_block_hash":nil,"token_ids":[1,2],
	//  "block_size":2,"group_idx":1,"kv_cache_spec_kind":"sliding_window"}
	[]byte{0x87},
	fixstr("type"), fixstr("BlockStored"),
	fixstr("block_hashes"), []byte{0x91, 0x05},
	fixstr("parent_block_hash"), []byte{0xc0},
	fixstr("token_ids"), []byte{0x92, 0x01, 0x02},
	fixstr("block_size"), []byte{0x02},
	fixstr("group_idx"), []byte{0x01},
	fixstr("kv_cache_spec_kind"), fixstr("sliding_window"),
)

// goldenMixedBatch: a map batch {ts, events, data_parallel_rank} whose events mix the
// two forms: a map BlockRemoved on the host, an array BlockStored with bigram token
// pairs and trailing fields past the known ones, and an unknown event type (counted).
var goldenMixedBatch = cat(
	[]byte{0x83}, fixstr("ts"), []byte{0x03}, // ts as an integer
	fixstr("events"), []byte{0x93},
	[]byte{0x83}, fixstr("type"), fixstr("BlockRemoved"), fixstr("block_hashes"), []byte{0x91, 0x07}, fixstr("medium"), fixstr("CPU"),
	// ["BlockStored",[8],7,[[1,2],[2,3]],2,nil,nil,nil,nil,0,"full_attention",nil,"extra"]
	[]byte{0x9d}, fixstr("BlockStored"), []byte{0x91, 0x08}, []byte{0x07},
	[]byte{0x92, 0x92, 0x01, 0x02, 0x92, 0x02, 0x03}, []byte{0x02}, []byte{0xc0, 0xc0, 0xc0, 0xc0, 0x00},
	fixstr("full_attention"), []byte{0xc0}, fixstr("extra"),
	[]byte{0x92}, fixstr("BlockMoved"), []byte{0x01},
	fixstr("data_parallel_rank"), []byte{0x03},
)

func TestDecodeGoldenPayloads(t *testing.T) {
	tests := []struct {
		name    string
		payload []byte
		want    Batch
	}{
		{"array form", goldenArrayBatch, Batch{TS: 1.5, HasRank: true, Rank: 0, Events: []Event{
			{Type: TypeBlockStored, BlockHashes: []uint64{0x1111, 0x2222}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: "GPU"},
			{Type: TypeBlockRemoved, BlockHashes: []uint64{0x2222}, Medium: "GPU"},
			{Type: TypeAllBlocksCleared},
		}}},
		{"map form", goldenMapBatch, Batch{TS: 2, Events: []Event{
			{Type: TypeBlockStored, BlockHashes: []uint64{math.MaxUint64, 5}, ZeroParent: true, TokenIDs: []uint32{7, 8, 9, 10}, BlockSize: 2,
				LoRAName: "sql", ExtraKeys: []ExtraKeys{{Strings: []string{"sql", "tenant"}}, {Strings: []string{"sql"}}}},
			{Type: TypeBlockStored, BlockHashes: []uint64{5}, TokenIDs: []uint32{1, 2}, BlockSize: 2, GroupIdx: 1, SpecKind: "sliding_window"},
		}}},
		{"mixed forms", goldenMixedBatch, Batch{TS: 3, HasRank: true, Rank: 3, Events: []Event{
			{Type: TypeBlockRemoved, BlockHashes: []uint64{7}, Medium: "CPU"},
			{Type: TypeBlockStored, BlockHashes: []uint64{8}, Parent: 7, HasParent: true, TokenIDs: []uint32{1, 2}, BlockSize: 2,
				Bigram: true, SpecKind: "full_attention"},
		}, Unknown: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := NewDecoder().Decode(tt.payload)
			require.NoError(t, err)
			assert.Equal(t, tt.want, *got)
		})
	}
}

func TestDecodeMarksMalformedEventsAndKeepsTheRest(t *testing.T) {
	payload := cat([]byte{0x92, 0x00, 0x93},
		// token_ids holds a string; block_hashes a nil entry; block_size is negative (0
		// is a store by hash alone, as vLLM's offloading connector sends)
		[]byte{0x95}, fixstr("BlockStored"), []byte{0x91, 0x01}, []byte{0xc0}, []byte{0x91}, fixstr("x"), []byte{0x01},
		[]byte{0x93}, fixstr("BlockRemoved"), []byte{0x91, 0xc0}, []byte{0xc0},
		[]byte{0x95}, fixstr("BlockStored"), []byte{0x91, 0x01}, []byte{0xc0}, []byte{0x90}, []byte{0xff},
		// a token id past uint32 and a negative one
	)
	got, err := NewDecoder().Decode(payload)
	require.NoError(t, err)
	require.Len(t, got.Events, 3)
	assert.Equal(t, []string{"token_ids", "block_hashes", "block_size"},
		[]string{got.Events[0].Malformed, got.Events[1].Malformed, got.Events[2].Malformed})

	big := cat([]byte{0x92, 0x00, 0x91, 0x95}, fixstr("BlockStored"), []byte{0x91, 0x01, 0xc0},
		[]byte{0x92, 0xcf, 0, 0, 0, 1, 0, 0, 0, 0, 0xff}, []byte{0x01})
	got, err = NewDecoder().Decode(big)
	require.NoError(t, err)
	assert.Equal(t, "token_ids", got.Events[0].Malformed)
}

func TestDecodeRejectsWhatIsNotABatch(t *testing.T) {
	tests := []struct {
		name    string
		payload []byte
	}{
		{"empty", nil},
		{"a string", fixstr("hi")},
		{"too few fields", []byte{0x91, 0x00}},
		{"truncated", goldenArrayBatch[:len(goldenArrayBatch)-5]},
		{"trailing bytes", append(append([]byte{}, goldenArrayBatch...), 0x00)},
		{"events not an array", []byte{0x92, 0x00, 0x01}},
		{"rank out of range", []byte{0x93, 0x00, 0x90, 0xce, 0x7f, 0, 0, 0}},
		{"hostile array length", []byte{0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff}},
		{"deep nesting", cat([]byte{0x92, 0x00, 0x91, 0x92}, fixstr("X"), bytesOf(0x91, 40), []byte{0x00})},
		{"map without events", []byte{0x81, 0xa2, 't', 's', 0x00}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewDecoder().Decode(tt.payload)
			assert.ErrorIs(t, err, ErrPayload)
		})
	}
}

func bytesOf(b byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}

// batchOf is the batch [0, [elem × n]] (the events array's length as an array32).
func batchOf(n int, elem ...[]byte) []byte {
	out := binary.BigEndian.AppendUint32([]byte{0x92, 0x00, 0xdd}, uint32(n))
	for range n {
		for _, e := range elem {
			out = append(out, e...)
		}
	}
	return out
}

// array32 is the header of an array of n elements.
func array32(n int) []byte { return binary.BigEndian.AppendUint32([]byte{0xdd}, uint32(n)) }

// TestDecodeCountsWhatIsNoEventAndRefusesOversizedBatches: a batch's events array
// is the engine's, and each element can be one byte. An element that is no event (not
// a map or an array, or an empty array) or of a type this version does not know is
// counted (Batch.Unknown), not kept, nor are its fields; a batch holding more than a
// batch may (maxBatchEvents events kept, maxBatchHashes hashes or extra_keys entries,
// maxBatchStrings extra key strings, maxBatchTokens token ids) is refused. Before,
// every element became an Event of about 200 bytes: 1 MB of one-byte elements held
// 244 MB.
func TestDecodeCountsWhatIsNoEventAndRefusesOversizedBatches(t *testing.T) {
	removedTag := cat([]byte{0x92}, fixstr("BlockRemoved"))
	storedMap := func(field string) []byte {
		return cat([]byte{0x82}, fixstr("type"), fixstr("BlockStored"), fixstr(field))
	}
	tests := []struct {
		name    string
		payload []byte
		events  int // kept
		unknown int
		refused bool
	}{
		{"fixints", batchOf(1<<18, []byte{0x00}), 0, 1 << 18, false},
		{"empty maps", batchOf(1<<18, []byte{0x80}), 0, 1 << 18, false},
		{"empty arrays", batchOf(1<<18, []byte{0x90}), 0, 1 << 18, false},
		{"an unknown type's fields", batchOf(2, cat([]byte{0x82}, fixstr("type"), fixstr("X"), fixstr("token_ids"), []byte{0x93, 1, 2, 3})), 0, 2, false},
		{"an event past it", batchOf(maxBatchEvents+1, []byte{0x91}, fixstr("AllBlocksCleared")), 0, 0, true},
		{"unknown ones past it", cat(batchOf(maxBatchEvents+1, []byte{0x91}, fixstr("X"))), 0, maxBatchEvents + 1, false},
		{"block hashes past the bound", batchOf(1, removedTag, array32(maxBatchHashes+1), make([]byte, maxBatchHashes+1)), 0, 0, true},
		{"extra_keys entries past the bound", batchOf(1, storedMap("extra_keys"), array32(maxBatchHashes+1), bytesOf(0xc0, maxBatchHashes+1)), 0, 0, true},
		{"extra key strings past the bound", batchOf(1, storedMap("extra_keys"), []byte{0x91}, array32(maxBatchStrings+1), bytesOf(0xa0, maxBatchStrings+1)), 0, 0, true},
		{"token ids past the bound", batchOf(1, storedMap("token_ids"), array32(maxBatchTokens+1), make([]byte, maxBatchTokens+1)), 0, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := NewDecoder().Decode(tt.payload)
			if tt.refused {
				assert.ErrorIs(t, err, ErrPayload)
				return
			}
			require.NoError(t, err)
			assert.Len(t, b.Events, tt.events)
			assert.Equal(t, tt.unknown, b.Unknown)
		})
	}
}

// TestTheApplierKeepsNoLargeBatchsMemory: after a batch, the worker's decoder keeps
// neither the payload nor the buffers a large batch grew (Decoder.Release), and never
// buffers a value it skips. Before, it kept them for the next batch: 1 MB of one-byte
// events left 244 MB (256 KB, 61 MB), and an unknown key's 8 MB string left an 8 MB
// buffer inside the msgpack decoder for good.
func TestTheApplierKeepsNoLargeBatchsMemory(t *testing.T) {
	const n = 1 << 18
	removedEvent := cat([]byte{0x92}, fixstr("BlockRemoved"), []byte{0x91, 0x02})
	tests := []struct {
		name    string
		payload []byte
	}{
		{"256 KB of one-byte elements", batchOf(n, []byte{0x00})},
		{"256 KB of empty maps", batchOf(n, []byte{0x80})},
		{"256 KB of removals", batchOf(n/len(removedEvent), removedEvent)},
		{"256 KB of nil extra keys", batchOf(1, cat([]byte{0x82}, fixstr("type"), fixstr("BlockStored"), fixstr("extra_keys")), array32(n), bytesOf(0xc0, n))},
		{"an unknown key's 8 MB string", cat([]byte{0x82}, fixstr("events"), []byte{0x90}, fixstr("x"), []byte{0xdb}, binary.BigEndian.AppendUint32(nil, 8<<20), make([]byte, 8<<20))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1, nil)
			h.apply(0, stored([]uint64{1}, 0, toks(0, testBS)))
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			require.NoError(t, h.a.Apply(0, tt.payload))
			runtime.GC()
			runtime.ReadMemStats(&after)
			retained := int64(after.HeapAlloc) - int64(before.HeapAlloc)
			runtime.KeepAlive(h)
			assert.Less(t, retained, int64(2<<20), "a %d KB payload left %d KB", len(tt.payload)>>10, retained>>10)
			assert.Equal(t, 1, h.overlap(toks(0, testBS), "", ""), "the block stored before is held")
		})
	}
	h := newHarness(t, 1, nil)
	require.NoError(t, h.a.Apply(0, batchOf(n, []byte{0x00})))
	assert.Equal(t, float64(n), h.count(TypeUnknown, outcomeUnknownType), "each element that is no event is counted")
}

// TestABatchOfClearsCostsItsEventsAlone: a batch of 262,144 AllBlocksCleared (6 MB)
// on a worker of a million blocks allocated 27 GB and took 3.5 s (a new table per
// store per clear), and a large batch's events slice was grown by append (about five
// times its size allocated in passing). It now allocates about twice its events (the slice doubles).
func TestABatchOfClearsCostsItsEventsAlone(t *testing.T) {
	const n = 1 << 18
	h := newHarnessOver(t, index.Config{CapacityBlocks: 1 << 20, TTL: time.Minute, PendingTTL: time.Second}, DefaultConfig(),
		WorkerSpec{Name: "w", Model: testModel, BlockSize: testBS, Ranks: 1, MaxEntries: 2000})
	h.apply(0, stored([]uint64{1}, 0, toks(0, testBS)))
	clears := make([]Event, n)
	for i := range clears {
		clears[i] = Event{Type: TypeAllBlocksCleared}
	}
	payload, err := Encode(&Batch{TS: float64(h.clock.Now().Unix()), Events: clears, HasRank: true}, FormArray)
	require.NoError(t, err)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	require.NoError(t, h.a.applyAt(0, payload, h.clock.Now()))
	runtime.ReadMemStats(&after)
	perEvent := (after.TotalAlloc - before.TotalAlloc) / n
	assert.LessOrEqual(t, perEvent, uint64(2*unsafe.Sizeof(Event{})), "bytes allocated per AllBlocksCleared")
	assert.Zero(t, h.overlap(toks(0, testBS), "", ""), "the clears forgot the stored block")
	assert.Equal(t, float64(n), h.count(TypeAllBlocksCleared, outcomeApplied), "every clear is counted")
}

func TestEncodeRoundTripsInBothForms(t *testing.T) {
	batch := &Batch{TS: 12.25, HasRank: true, Rank: 1, Events: []Event{
		{Type: TypeBlockStored, BlockHashes: []uint64{1 << 63, 2}, Parent: 9, HasParent: true, TokenIDs: []uint32{1, 2, 70000, 4},
			BlockSize: 2, Medium: "GPU", LoRAName: "a", ExtraKeys: []ExtraKeys{{Strings: []string{"a", "salt"}}, {Strings: []string{"a"}}}},
		{Type: TypeBlockRemoved, BlockHashes: []uint64{2}},
		{Type: TypeAllBlocksCleared},
	}}
	for _, form := range []Form{FormMap, FormArray} {
		payload, err := Encode(batch, form)
		require.NoError(t, err)
		got, err := NewDecoder().Decode(payload)
		require.NoError(t, err)
		assert.Equal(t, *batch, *got)
	}
	_, err := Encode(&Batch{Events: []Event{{Type: TypeUnknown}}}, FormMap)
	assert.Error(t, err)
}

func TestDecoderReusesBuffersAcrossBatches(t *testing.T) {
	d := NewDecoder()
	first, err := d.Decode(goldenArrayBatch)
	require.NoError(t, err)
	hashes := first.Events[0].BlockHashes
	_, err = d.Decode(goldenMapBatch)
	require.NoError(t, err)
	again, err := d.Decode(goldenArrayBatch)
	require.NoError(t, err)
	assert.Equal(t, []uint64{0x1111, 0x2222}, again.Events[0].BlockHashes)
	assert.Len(t, hashes, 2)
}

func TestFrames(t *testing.T) {
	live := [][]byte{[]byte("kv@10.0.0.1@qwen"), {0, 0, 0, 0, 0, 0, 1, 2}, {0x90}}
	m, err := ParseMessage(live)
	require.NoError(t, err)
	assert.Equal(t, Message{Topic: []byte("kv@10.0.0.1@qwen"), Seq: 258, Payload: []byte{0x90}}, m)
	assert.Equal(t, live, MessageFrames("kv@10.0.0.1@qwen", 258, []byte{0x90}))
	for _, bad := range [][][]byte{live[:2], {live[0], {1, 2}, live[2]}} {
		_, err := ParseMessage(bad)
		assert.ErrorIs(t, err, ErrFrames)
	}

	assert.Equal(t, [][]byte{{}, {0, 0, 0, 0, 0, 0, 0, 7}}, ReplayRequest(7))
	id, start, err := ParseReplayRequest([][]byte{[]byte("peer"), {}, {0, 0, 0, 0, 0, 0, 0, 7}})
	require.NoError(t, err)
	assert.Equal(t, []byte("peer"), id)
	assert.Equal(t, uint64(7), start)

	tests := []struct {
		name   string
		frames [][]byte
		want   Message
		end    bool
	}{
		{"without topic", [][]byte{{}, {0, 0, 0, 0, 0, 0, 0, 5}, {0x90}}, Message{Seq: 5, Payload: []byte{0x90}}, false},
		{"with topic", [][]byte{{}, []byte("t"), {0, 0, 0, 0, 0, 0, 0, 5}, {0x90}}, Message{Topic: []byte("t"), Seq: 5, Payload: []byte{0x90}}, false},
		{"end without topic", [][]byte{{}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, {}}, Message{Seq: endSeq, Payload: []byte{}}, true},
		{"end with topic", [][]byte{{}, []byte("t"), {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, {}}, Message{Topic: []byte("t"), Seq: endSeq, Payload: []byte{}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, end, err := ParseReplay(tt.frames)
			require.NoError(t, err)
			assert.Equal(t, tt.want, m)
			assert.Equal(t, tt.end, end)
		})
	}
	assert.Equal(t, [][]byte{{}, {0, 0, 0, 0, 0, 0, 0, 5}, {0x90}}, ReplayFrames(ReplayWithoutTopic, "t", 5, []byte{0x90}))
	assert.Equal(t, [][]byte{{}, []byte("t"), {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, {}}, ReplayEnd(ReplayWithTopic, "t"))
	for _, bad := range [][][]byte{{{}, {1}}, {{1}, {0, 0, 0, 0, 0, 0, 0, 5}, {}}, {{}, {5}, {}}} {
		_, _, err := ParseReplay(bad)
		assert.ErrorIs(t, err, ErrFrames)
	}
}
