package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func TestDecodeReadsBothEncodingsAlike(t *testing.T) {
	events := []any{
		wireStored{hashes: []any{101, 102}, parent: nil, tokens: seq(0, 32), blockSize: 16, medium: "GPU"},
		wireStored{hashes: []any{103}, parent: 102, tokens: seq(32, 16), blockSize: 16, loraID: 7, medium: "CPU", loraName: "sql"},
		wireRemoved{hashes: []any{101}, medium: "GPU"},
		wireCleared{},
	}
	want := Batch{TS: 1733000000.25, DPRank: 2, HasDPRank: true, Events: []Event{
		{Kind: Stored, BlockHashes: []Hash{101, 102}, TokenIDs: u32(seq(0, 32)), BlockSize: 16},
		{Kind: Stored, BlockHashes: []Hash{103}, Parent: 102, HasParent: true, TokenIDs: u32(seq(32, 16)), BlockSize: 16, LoRA: "sql", Offloaded: true},
		{Kind: Removed, BlockHashes: []Hash{101}},
		{Kind: Cleared},
	}}
	for name, payload := range map[string][]byte{"arrays": encodeArrays(t, 2, events...), "maps": encodeMaps(t, 2, events...)} {
		if got := decode(t, payload); !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got %+v\nwant %+v", name, got, want)
		}
	}
}

func TestDecodeFoldsByteStringHashesConsistently(t *testing.T) {
	h1, h2 := []byte("0123456789abcdef0123456789abcdef"), []byte("fedcba9876543210fedcba9876543210")
	b := decode(t, encodeArrays(t, nil,
		wireStored{hashes: []any{h1}, tokens: seq(0, 4), blockSize: 4},
		wireStored{hashes: []any{h2}, parent: h1, tokens: seq(4, 4), blockSize: 4},
		wireRemoved{hashes: []any{h2}},
	))
	if b.Events[1].Parent != b.Events[0].BlockHashes[0] || b.Events[2].BlockHashes[0] != b.Events[1].BlockHashes[0] {
		t.Fatalf("the same byte-string hash folded to different values: %+v", b.Events)
	}
	if b.Events[0].BlockHashes[0] == b.Events[1].BlockHashes[0] {
		t.Fatal("two different hashes folded to one")
	}
	if b.HasDPRank {
		t.Fatal("a nil data_parallel_rank read as set")
	}
}

func TestDecodeReadsOlderEnginesShorterEvents(t *testing.T) {
	// Engines before medium and lora_name send six and five positional fields.
	six, _ := msgpack.Marshal([]any{1.0, []any{[]any{"BlockStored", []any{1}, nil, seq(0, 2), 2, 3, "GPU"}}})
	five, _ := msgpack.Marshal([]any{1.0, []any{[]any{"BlockStored", []any{1}, nil, seq(0, 2), 2, nil}, []any{"BlockRemoved", []any{1}}}})
	if e := decode(t, six).Events[0]; e.LoRA != "lora-id:3" || e.Offloaded || len(e.TokenIDs) != 2 {
		t.Errorf("six fields: %+v", e)
	}
	if b := decode(t, five); len(b.Events) != 2 || b.Events[0].LoRA != "" || b.Events[1].Kind != Removed {
		t.Errorf("five fields: %+v", b)
	}
}

func TestDecodeSkipsEventKindsItDoesNotKnow(t *testing.T) {
	for name, payload := range map[string][]byte{
		"arrays": encodeArrays(t, nil, []any{"BlockPinned", []any{1, 2}, "GPU"}, wireCleared{}),
		"maps":   encodeMaps(t, nil, map[string]any{"type": "BlockPinned", "block_hashes": []any{1}}, wireCleared{}),
	} {
		b := decode(t, payload)
		if b.Unknown != 1 || len(b.Events) != 1 || b.Events[0].Kind != Cleared {
			t.Errorf("%s: %+v", name, b)
		}
	}
}

func TestDecodeRefusesWhatIsNotAnEventBatch(t *testing.T) {
	good := encodeArrays(t, 0, wireStored{hashes: []any{1, 2}, tokens: seq(0, 8), blockSize: 4})
	huge := []byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0x7f, 0xff, 0xff, 0xff} // events: an array of 2^31-1
	cases := map[string][]byte{
		"empty":          {},
		"truncated":      good[:len(good)-3],
		"trailing bytes": append(append([]byte{}, good...), 0xc0),
		"a string":       []byte{0xa3, 'a', 'b', 'c'},
		"a lying length": huge,
		"token too big":  mustMarshal(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{uint64(1) << 40}, 1, nil, nil}}}),
		"tagless event":  mustMarshal(t, []any{1.0, []any{[]any{}}}),
	}
	for name, payload := range cases {
		if _, err := NewDecoder().Decode(payload); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err %v, want ErrMalformed", name, err)
		}
	}
}

func TestDecodedBatchSharesNoMemoryWithThePayload(t *testing.T) {
	salt, _ := msgpack.Marshal([]any{"salt-1"})
	payload := encodeMaps(t, nil, wireStored{hashes: []any{[]byte("h")}, tokens: seq(0, 2), blockSize: 2, loraName: "sql", extraKeys: []any{[]any{"salt-1"}}})
	b := decode(t, payload)
	for i := range payload {
		payload[i] = 0
	}
	if e := b.Events[0]; e.LoRA != "sql" || string(e.ExtraKeys[0]) != string(salt) {
		t.Fatalf("the batch changed with its payload: %+v", e)
	}
}

// nested is n arrays, each holding the next, around a nil.
func nested(n int) msgpack.RawMessage {
	return append(bytes.Repeat([]byte{0x91}, n), 0xc0)
}

// Arrays and maps may nest maxNesting deep wherever the decoder meets them (a field it skips, an
// extra key it keeps raw); one level more is refused, whichever the encoding.
func TestDecodeRefusesNestingPastItsLimit(t *testing.T) {
	cases := map[string]struct {
		depth   int // where the nested value sits: the batch is at 0
		payload func(v msgpack.RawMessage) []byte
	}{
		"a batch field of the map encoding": {1, func(v msgpack.RawMessage) []byte {
			return mustMarshal(t, map[string]any{"ts": 1.0, "events": []any{}, "extra": v})
		}},
		"a batch element past the third": {1, func(v msgpack.RawMessage) []byte {
			return mustMarshal(t, []any{1.0, []any{}, 0, v})
		}},
		"an event field of the map encoding": {3, func(v msgpack.RawMessage) []byte {
			return encodeMaps(t, nil, map[string]any{"type": "BlockRemoved", "block_hashes": []any{1}, "extra": v})
		}},
		"an event element past the known fields": {3, func(v msgpack.RawMessage) []byte {
			return encodeArrays(t, nil, []any{"BlockRemoved", []any{1}, nil, 0, v})
		}},
		"an event of a kind not known": {3, func(v msgpack.RawMessage) []byte {
			return encodeArrays(t, nil, []any{"BlockPinned", v})
		}},
		"a block's extra keys": {4, func(v msgpack.RawMessage) []byte {
			return encodeArrays(t, nil, wireStored{hashes: []any{1}, tokens: seq(0, 4), blockSize: 4, extraKeys: []any{v}})
		}},
	}
	for name, c := range cases {
		deepest := maxNesting - c.depth // arrays that fit from c.depth on
		if _, err := NewDecoder().Decode(c.payload(nested(deepest))); err != nil {
			t.Errorf("%s: %d arrays nested, within the limit: %v", name, deepest, err)
		}
		if _, err := NewDecoder().Decode(c.payload(nested(deepest + 1))); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %d arrays nested, one past the limit: err %v, want ErrMalformed", name, deepest+1, err)
		}
	}
}

// A payload of eight million nested maps (24 MB) overflowed the stack in msgpack's recursive Skip,
// a fatal error no recover catches; it is refused at the limit.
func TestDecodeRefusesEightMillionNestedMapsWithoutOverflowingTheStack(t *testing.T) {
	const levels = 8 << 20
	payload := append([]byte{0x83, 0xa2, 't', 's', 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xa6, 'e', 'v', 'e', 'n', 't', 's', 0x90, 0xa1, 'x'},
		bytes.Repeat([]byte{0x81, 0xa1, 'k'}, levels)...)
	payload = append(payload, 0xc0)
	if _, err := NewDecoder().Decode(payload); !errors.Is(err, ErrMalformed) {
		t.Fatalf("err %v, want ErrMalformed", err)
	}
}

// array32 is a msgpack array of n elements, given already encoded.
func array32(n int, elements []byte) msgpack.RawMessage {
	return append(binary.BigEndian.AppendUint32([]byte{0xdd}, uint32(n)), elements...)
}

// A batch is at most MaxMessageBytes, and what decoding one allocates is bounded by its size: an
// array of one-byte values, each decoded into an entry of its own, is the worst, 24 times (a
// slice's header for each of a block's extra keys). An event array of many events of no known
// kind no longer sizes the batch's events by its length (136 bytes each), nor does a block's
// missing extra key cost a copy.
func TestDecodeAllocatesAtMost24TimesThePayload(t *testing.T) {
	const n = 1 << 18
	tag := append([]byte{0x91, 0xab}, "BlockStored"...)
	cases := map[string][]byte{
		"extra keys, all nil": mustMarshal(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{}, 4, nil, nil, nil,
			array32(n, bytes.Repeat([]byte{0xc0}, n))}}}),
		"block hashes of one byte":               mustMarshal(t, []any{1.0, []any{[]any{"BlockRemoved", array32(n, bytes.Repeat([]byte{0x01}, n))}}}),
		"token ids of one byte":                  mustMarshal(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, array32(n, bytes.Repeat([]byte{0x01}, n)), 4}}}),
		"the smallest events":                    mustMarshal(t, []any{1.0, array32(n/len(tag), bytes.Repeat(tag, n/len(tag)))}),
		"events of unknown kinds, one byte each": mustMarshal(t, []any{1.0, array32(1+n, append(tag, bytes.Repeat([]byte{0x80}, n)...))}),
	}
	for name, payload := range cases {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		if _, err := NewDecoder().Decode(payload); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		runtime.ReadMemStats(&after)
		if got := after.TotalAlloc - before.TotalAlloc; got > 24*uint64(len(payload))+64<<10 {
			t.Errorf("%s: %d bytes allocated for a payload of %d, %.1f times", name, got, len(payload), float64(got)/float64(len(payload)))
		}
	}
}

// A string, byte string or ext whose header claims more than the payload has left is refused
// before anything is made for it, by one decoder kept across the payloads as a worker's
// subscriber keeps it: msgpack's own reader made 4 GiB for such a hash, and grew its kept buffer
// for the others.
func TestDecodeAllocatesNothingForTheLengthAStringClaims(t *testing.T) {
	lie := func(code byte) []byte { return []byte{code, 0xff, 0xff, 0xff, 0xf0, 'a', 'b'} } // 4 GiB claimed, 2 bytes there
	removed := func(hash []byte) []byte {
		return append([]byte{0x92, 0x01, 0x91, 0x92, 0xac}, append([]byte("BlockRemoved\x91"), hash...)...)
	}
	cases := map[string][]byte{
		"a block hash as bin 32":   removed(lie(0xc6)),
		"a block hash as str 32":   removed(lie(0xdb)),
		"an event's tag":           append([]byte{0x92, 0x01, 0x91, 0x91}, lie(0xdb)...),
		"a batch field's name":     append([]byte{0x81}, lie(0xdb)...),
		"a value skipped (str 32)": append([]byte{0x94, 0x01, 0x90, 0x00}, lie(0xdb)...),
		"a value skipped (bin 32)": append([]byte{0x94, 0x01, 0x90, 0x00}, lie(0xc6)...),
		"a value skipped (ext 32)": append([]byte{0x94, 0x01, 0x90, 0x00}, lie(0xc9)...),
	}
	dec := NewDecoder()
	for name, payload := range cases {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := dec.Decode(payload)
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err %v, want ErrMalformed", name, err)
		}
		if got := after.TotalAlloc - before.TotalAlloc; got > 64<<10 {
			t.Errorf("%s: %d bytes allocated for a payload of %d bytes", name, got, len(payload))
		}
	}
}

func mustMarshal(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func FuzzDecode(f *testing.F) {
	f.Add(encodeArrays(f, 1, wireStored{hashes: []any{1, 2}, parent: 9, tokens: seq(0, 8), blockSize: 4, medium: "GPU"}, wireRemoved{hashes: []any{1}}, wireCleared{}))
	f.Add(encodeMaps(f, nil, wireStored{hashes: []any{[]byte("ab")}, tokens: seq(0, 4), blockSize: 4, loraName: "x", extraKeys: []any{[]any{"x", "s"}}}))
	f.Add([]byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0x7f, 0xff, 0xff, 0xff})
	// Nesting at the limit and past it, where values are skipped and where extra keys are kept raw.
	f.Add(mustMarshal(f, map[string]any{"ts": 1.0, "events": []any{}, "x": nested(maxNesting - 1)}))
	f.Add(mustMarshal(f, []any{1.0, []any{}, 0, nested(maxNesting)}))
	f.Add(encodeArrays(f, nil, wireStored{hashes: []any{1}, tokens: seq(0, 4), blockSize: 4, extraKeys: []any{nested(maxNesting - 4)}}))
	f.Add(append([]byte{0x82, 0xa6, 'e', 'v', 'e', 'n', 't', 's', 0x90, 0xa1, 'x'}, bytes.Repeat([]byte{0x81, 0xa1, 'k'}, 100_000)...))
	// A first block whose parent is 0, as llm-d's simulator sends it.
	f.Add(encodeArrays(f, nil, wireStored{hashes: []any{1, 2}, parent: 0, tokens: seq(0, 8), blockSize: 4}))
	dec := NewDecoder()
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := dec.Decode(payload)
		if err != nil {
			return
		}
		// Whatever decodes applies to an index without a panic, within its budget.
		x := NewIndex(64 * perBlockBytes)
		x.Apply("w", "m", b)
		if x.Bytes() > 64*perBlockBytes || x.Bytes() < 0 {
			t.Fatalf("index bytes %d outside [0, budget]", x.Bytes())
		}
	})
}

// referenceTokenIDs reads an array of token ids the way tokens did before it read the payload
// itself: msgpack.Decoder.DecodeUint64 for each, then the range check.
func referenceTokenIDs(payload []byte) ([]uint32, int, error) {
	r := bytes.NewReader(payload)
	d := msgpack.NewDecoder(r)
	n, err := d.DecodeArrayLen()
	if err != nil || n > r.Len() {
		return nil, 0, fmt.Errorf("bad length %d: %v", n, err)
	}
	n = max(n, 0) // a nil in place of the array reads as empty (Decoder.length)
	out := make([]uint32, n)
	for i := range out {
		v, err := d.DecodeUint64()
		if err != nil {
			return nil, 0, err
		}
		if v > 1<<32-1 {
			return nil, 0, fmt.Errorf("token id %d out of range", v)
		}
		out[i] = uint32(v)
	}
	return out, len(payload) - r.Len(), nil
}

// decodeTokenIDs reads an array of token ids with the decoder's tokens, and the bytes it took.
func decodeTokenIDs(payload []byte) ([]uint32, int, error) {
	dec := NewDecoder()
	dec.payload = payload
	dec.r.Reset(payload)
	dec.d.Reset(&dec.r)
	ids, err := dec.tokens()
	return ids, dec.pos(), err
}

func checkTokenIDsAgree(t *testing.T, payload []byte) {
	t.Helper()
	want, wantUsed, wantErr := referenceTokenIDs(payload)
	got, used, err := decodeTokenIDs(payload)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("payload %x: error %v, msgpack's decoder: %v", payload, err, wantErr)
	}
	if err == nil && (!slices.Equal(got, want) || used != wantUsed) {
		t.Fatalf("payload %x: %v in %d bytes, msgpack's decoder: %v in %d", payload, got, used, want, wantUsed)
	}
}

func TestTokenIDsReadAsMsgpacksDecoderReadsThem(t *testing.T) {
	var values []any
	for _, v := range []int64{0, 1, 127, 128, 255, 256, 65535, 65536, 1<<31 - 1, 1 << 31, 1<<32 - 1, 1 << 32, -1, -32, -33, -128, -129, -32768, -32769, -1 << 31, -1<<31 - 1} {
		values = append(values, v, uint64(v), int8(v), int16(v), int32(v), uint8(v), uint16(v), uint32(v))
	}
	values = append(values, nil, 1.0, "7", true, []any{1})
	for _, v := range values {
		one := mustMarshal(t, []any{v, 5})
		checkTokenIDsAgree(t, one)
		for cut := 1; cut < len(one); cut++ { // every truncation
			checkTokenIDsAgree(t, one[:cut])
		}
	}
	// Every integer form msgpack has, encoded by hand where the encoder would pick a shorter one.
	for _, p := range [][]byte{
		{0x91, 0xcc, 7}, {0x91, 0xcd, 0, 7}, {0x91, 0xce, 0, 0, 0, 7}, {0x91, 0xcf, 0, 0, 0, 0, 0, 0, 0, 7},
		{0x91, 0xd0, 7}, {0x91, 0xd1, 0, 7}, {0x91, 0xd2, 0, 0, 0, 7}, {0x91, 0xd3, 0, 0, 0, 0, 0, 0, 0, 7},
		{0x91, 0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, {0x91, 0xcf, 0, 0, 0, 1, 0, 0, 0, 0},
		{0x91, 0xd2, 0x80, 0, 0, 0}, {0x91, 0xce, 0xff, 0xff, 0xff, 0xff},
	} {
		checkTokenIDsAgree(t, p)
	}
}

func FuzzTokenIDsReadAsMsgpacksDecoderReadsThem(f *testing.F) {
	f.Add(mustMarshal(f, seq(0, 300)))
	f.Add([]byte{0x92, 0xd3, 0, 0, 0, 0, 0, 0, 0, 7, 0xc0})
	f.Add([]byte{0x93, 0xff, 0xcc, 0x80, 0xd0})
	f.Fuzz(func(t *testing.T, payload []byte) {
		checkTokenIDsAgree(t, payload)
	})
}
