// Package kvevents reads the KV-cache events that vLLM engines publish (--kv-events-config) and
// keeps an index of the blocks each worker holds, keyed by the router's own chained block keys,
// so that routing can ask how much of a request's prefix a worker really has cached.
//
// The wire format, as vLLM's vllm/distributed/kv_events.py defines it: each ZMQ message is three
// frames (topic, an 8-byte big-endian sequence number, a msgpack payload). The payload is an
// EventBatch {ts, events, data_parallel_rank} whose events are BlockStored {block_hashes,
// parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx, …},
// BlockRemoved {block_hashes, medium, group_idx} and AllBlocksCleared. Engines encode structs in
// one of two ways, and both are read here: positional arrays, each event tagged by its class name
// in its first element (msgspec's array_like), or maps whose "type" key holds the tag. An engine
// block hash is an integer or a byte string, depending on the engine's version.
package kvevents

import (
	"bytes"
	"errors"
	"fmt"
	"hash/maphash"
	"io"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Kind is the kind of one event.
type Kind uint8

const (
	Stored  Kind = iota + 1 // BlockStored: blocks entered the cache
	Removed                 // BlockRemoved: blocks left it
	Cleared                 // AllBlocksCleared: the whole cache was emptied (restart, reset)
)

// Hash is an engine's block hash, folded to 64 bits: integers as they are, byte strings hashed.
// It is only ever compared with other hashes of the same engine, to apply BlockRemoved.
type Hash uint64

// Event is one decoded KV-cache event.
type Event struct {
	Kind        Kind
	BlockHashes []Hash
	// Parent is the hash of the block the first stored block follows; HasParent is false for a
	// sequence's first block.
	Parent    Hash
	HasParent bool
	TokenIDs  []uint32 // the stored blocks' tokens, block after block
	BlockSize int
	// LoRA names the adapter the blocks were computed with ("" for the base model). Engines that
	// send only the deprecated lora_id get "lora-id:<n>".
	LoRA string
	// Offloaded is set when the blocks live on a medium other than the GPU (CPU, disk).
	Offloaded bool
	// ExtraKeys are the per-block extra hash inputs (multimodal ids, cache_salt …), each as its
	// msgpack bytes; nil when the engine sends none.
	ExtraKeys [][]byte
	Group     int // the KV cache group (hybrid models), 0 by default
}

// Batch is one decoded EventBatch.
type Batch struct {
	TS        float64
	Events    []Event
	DPRank    int
	HasDPRank bool
	Unknown   int // events of a kind this decoder does not know, skipped
}

// ErrMalformed wraps every decoding error: the payload is not an EventBatch.
var ErrMalformed = errors.New("kvevents: malformed event batch")

// maxNesting bounds how deep arrays and maps nest in a payload: the batch is at depth 0, its
// events array at 1, an event at 2, its fields at 3, a block's extra-key tuple at 4. A value
// nested deeper is refused before it is walked: msgpack's own Skip recurses once per level, and a
// payload of millions of nested maps overflowed the stack.
const maxNesting = 16

// Decoder decodes payloads; one is reused for many, by one goroutine at a time.
type Decoder struct {
	payload []byte
	r       bytes.Reader
	d       *msgpack.Decoder
}

// NewDecoder returns a decoder.
func NewDecoder() *Decoder {
	dec := &Decoder{}
	dec.d = msgpack.NewDecoder(&dec.r)
	return dec
}

// hashSeed folds byte-string engine hashes; any fixed seed does, within one process.
var hashSeed = maphash.MakeSeed()

// Decode decodes one payload. Nothing in the result aliases payload.
func (dec *Decoder) Decode(payload []byte) (Batch, error) {
	dec.payload = payload
	defer func() { dec.payload = nil }()
	dec.r.Reset(payload)
	dec.d.Reset(&dec.r)
	var b Batch
	if err := dec.batch(&b); err != nil {
		return Batch{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if dec.r.Len() != 0 {
		return Batch{}, fmt.Errorf("%w: %d bytes after the batch", ErrMalformed, dec.r.Len())
	}
	return b, nil
}

// length checks a decoded array or map length against what is left of the payload: every element
// takes at least one byte, so a length claiming more is a lie that must not size an allocation.
// A nil in place of an array or map reads as empty.
func (dec *Decoder) length(n int, err error) (int, error) {
	if err != nil || n < 0 {
		return 0, err
	}
	if n > dec.r.Len() {
		return 0, fmt.Errorf("length %d exceeds the %d bytes left", n, dec.r.Len())
	}
	return n, nil
}

func (dec *Decoder) batch(b *Batch) error {
	code, err := dec.d.PeekCode()
	if err != nil {
		return err
	}
	if isMap(code) {
		n, err := dec.length(dec.d.DecodeMapLen())
		if err != nil {
			return err
		}
		for range n {
			key, err := dec.str()
			if err != nil {
				return err
			}
			switch key {
			case "ts":
				b.TS, err = dec.d.DecodeFloat64()
			case "events":
				err = dec.events(b)
			case "data_parallel_rank":
				b.DPRank, b.HasDPRank, err = dec.optInt()
			default:
				err = dec.skip(1)
			}
			if err != nil {
				return fmt.Errorf("batch field %q: %w", key, err)
			}
		}
		return nil
	}
	n, err := dec.length(dec.d.DecodeArrayLen())
	if err != nil {
		return err
	}
	if n < 2 {
		return fmt.Errorf("a batch array of %d elements", n)
	}
	if b.TS, err = dec.d.DecodeFloat64(); err != nil {
		return err
	}
	if err := dec.events(b); err != nil {
		return err
	}
	if n > 2 {
		if b.DPRank, b.HasDPRank, err = dec.optInt(); err != nil {
			return err
		}
	}
	for i := 3; i < n; i++ {
		if err := dec.skip(1); err != nil {
			return err
		}
	}
	return nil
}

func (dec *Decoder) events(b *Batch) error {
	n, err := dec.length(dec.d.DecodeArrayLen())
	if err != nil {
		return err
	}
	// Every event of a known kind takes at least minEventBytes, so this is room for all there can
	// be, and no more: n is only a claim, and an Event is ten times its smallest encoding.
	b.Events = make([]Event, 0, min(n, dec.r.Len()/minEventBytes+1))
	for range n {
		var e Event
		known, err := dec.event(&e)
		if err != nil {
			return err
		}
		if known {
			b.Events = append(b.Events, e)
		} else {
			b.Unknown++
		}
	}
	return nil
}

// minEventBytes is the smallest encoding of an event of a known kind: an array holding the tag
// "BlockStored" alone (a map holds "type" besides).
const minEventBytes = 1 + 1 + len("BlockStored")

// Field names, in the positional order of each event after its tag.
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

func kindOf(tag string) (Kind, []string) {
	switch tag {
	case "BlockStored":
		return Stored, storedFields
	case "BlockRemoved":
		return Removed, removedFields
	case "AllBlocksCleared":
		return Cleared, nil
	}
	return 0, nil
}

// event decodes one event into e and reports whether its kind is known (an unknown one is
// skipped whole).
func (dec *Decoder) event(e *Event) (bool, error) {
	code, err := dec.d.PeekCode()
	if err != nil {
		return false, err
	}
	loraID, hasLoraID := 0, false
	field := func(name string) error {
		var err error
		switch name {
		case "block_hashes":
			e.BlockHashes, err = dec.hashes()
		case "parent_block_hash":
			e.Parent, e.HasParent, err = dec.parent()
		case "token_ids":
			e.TokenIDs, err = dec.tokens()
		case "block_size":
			e.BlockSize, _, err = dec.optInt()
		case "lora_id":
			loraID, hasLoraID, err = dec.optInt()
		case "medium":
			var m string
			m, err = dec.optString()
			e.Offloaded = m != "" && m != "GPU"
		case "lora_name":
			e.LoRA, err = dec.optString()
		case "extra_keys":
			e.ExtraKeys, err = dec.extraKeys()
		case "group_idx":
			e.Group, _, err = dec.optInt()
		default:
			err = dec.skip(3)
		}
		if err != nil {
			return fmt.Errorf("event field %q: %w", name, err)
		}
		return nil
	}
	if isMap(code) {
		n, err := dec.length(dec.d.DecodeMapLen())
		if err != nil {
			return false, err
		}
		for range n {
			key, err := dec.str()
			if err != nil {
				return false, err
			}
			if key == "type" {
				tag, err := dec.str()
				if err != nil {
					return false, err
				}
				e.Kind, _ = kindOf(tag)
				continue
			}
			if err := field(key); err != nil {
				return false, err
			}
		}
	} else {
		n, err := dec.length(dec.d.DecodeArrayLen())
		if err != nil {
			return false, err
		}
		if n < 1 {
			return false, errors.New("an event array without its tag")
		}
		tag, err := dec.str()
		if err != nil {
			return false, err
		}
		kind, fields := kindOf(tag)
		e.Kind = kind
		for i := 1; i < n; i++ {
			name := ""
			if kind != 0 && i-1 < len(fields) {
				name = fields[i-1]
			}
			if err := field(name); err != nil {
				return false, err
			}
		}
	}
	if e.Kind == 0 {
		return false, nil
	}
	if e.LoRA == "" && hasLoraID {
		e.LoRA = fmt.Sprintf("lora-id:%d", loraID)
	}
	return true, nil
}

func (dec *Decoder) hashes() ([]Hash, error) {
	n, err := dec.length(dec.d.DecodeArrayLen())
	if err != nil {
		return nil, err
	}
	out := make([]Hash, n)
	for i := range out {
		if out[i], err = dec.hash(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// hash reads an engine block hash: an integer, or a byte or text string folded to 64 bits.
func (dec *Decoder) hash() (Hash, error) {
	code, err := dec.d.PeekCode()
	if err != nil {
		return 0, err
	}
	switch {
	case msgpcode.IsBin(code) || msgpcode.IsString(code):
		b, err := dec.bytes()
		if err != nil {
			return 0, err
		}
		return Hash(maphash.Bytes(hashSeed, b)), nil
	default: // any integer, a negative one as its two's complement

		v, err := dec.d.DecodeUint64()
		return Hash(v), err
	}
}

// parent reads parent_block_hash. A sequence's first block has none: vLLM sends nil, and llm-d's
// simulator the integer 0, which llm-d's own consumers read as none too.
func (dec *Decoder) parent() (Hash, bool, error) {
	code, err := dec.d.PeekCode()
	if err != nil || code == msgpcode.Nil {
		return 0, false, dec.d.DecodeNil()
	}
	integer := !msgpcode.IsBin(code) && !msgpcode.IsString(code)
	h, err := dec.hash()
	return h, err == nil && !(integer && h == 0), err
}

// tokens reads a BlockStored event's token ids. They are most of a payload, one per token of
// every stored block, so they are read straight from the payload rather than through one
// msgpack.Decoder call each (which was three quarters of the router's work on an engine's events);
// tokenID takes the integer forms msgpack.Decoder.DecodeUint64 takes.
func (dec *Decoder) tokens() ([]uint32, error) {
	n, err := dec.length(dec.d.DecodeArrayLen())
	if err != nil {
		return nil, err
	}
	out := make([]uint32, n)
	p := dec.payload[dec.pos():]
	for i := range out {
		id, size, err := tokenID(p)
		if err != nil {
			return nil, err
		}
		out[i], p = id, p[size:]
	}
	_, err = dec.r.Seek(int64(len(dec.payload)-len(p)), io.SeekStart) // the msgpack decoder reads on from there
	return out, err
}

// tokenID reads the msgpack integer at the start of p as a token id, and how many bytes it took: a
// nil reads as 0, as it does for msgpack.Decoder.DecodeUint64, and an integer outside [0, 2^32)
// is an error.
func tokenID(p []byte) (id uint32, size int, err error) {
	if len(p) == 0 {
		return 0, 0, io.ErrUnexpectedEOF
	}
	code := p[0]
	switch {
	case msgpcode.IsFixedNum(code):
		if int8(code) < 0 {
			return 0, 0, fmt.Errorf("token id %d out of range", int8(code))
		}
		return uint32(code), 1, nil
	case code == msgpcode.Nil:
		return 0, 1, nil
	}
	var width int
	signed := false
	switch code {
	case msgpcode.Uint8, msgpcode.Uint16, msgpcode.Uint32, msgpcode.Uint64:
		width = 1 << (code - msgpcode.Uint8)
	case msgpcode.Int8, msgpcode.Int16, msgpcode.Int32, msgpcode.Int64:
		width, signed = 1<<(code-msgpcode.Int8), true
	default:
		return 0, 0, fmt.Errorf("msgpack: invalid code=%x decoding a token id", code)
	}
	if len(p) < 1+width {
		return 0, 0, io.ErrUnexpectedEOF
	}
	var v uint64
	for _, b := range p[1 : 1+width] {
		v = v<<8 | uint64(b)
	}
	if signed && v>>(8*width-1) != 0 { // negative
		return 0, 0, fmt.Errorf("token id %d out of range", int64(v<<(64-8*width))>>(64-8*width))
	}
	if v > 1<<32-1 {
		return 0, 0, fmt.Errorf("token id %d out of range", v)
	}
	return uint32(v), 1 + width, nil
}

func (dec *Decoder) extraKeys() ([][]byte, error) {
	if code, err := dec.d.PeekCode(); err != nil || code == msgpcode.Nil {
		return nil, dec.d.DecodeNil()
	}
	n, err := dec.length(dec.d.DecodeArrayLen())
	if err != nil {
		return nil, err
	}
	out := make([][]byte, n)
	for i := range out {
		if code, err := dec.d.PeekCode(); err != nil || code == msgpcode.Nil {
			if err := dec.d.DecodeNil(); err != nil {
				return nil, err
			}
			continue // no extra key for this block
		}
		if out[i], err = dec.raw(4); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (dec *Decoder) optInt() (int, bool, error) {
	if code, err := dec.d.PeekCode(); err != nil || code == msgpcode.Nil {
		return 0, false, dec.d.DecodeNil()
	}
	v, err := dec.d.DecodeInt64()
	return int(v), err == nil, err
}

func (dec *Decoder) optString() (string, error) {
	if code, err := dec.d.PeekCode(); err != nil || code == msgpcode.Nil {
		return "", dec.d.DecodeNil()
	}
	return dec.str()
}

// bytes reads a byte or text string as the payload's own bytes (nil reads as empty), its length
// checked against what the payload has left before anything is read: msgpack's DecodeBytes
// makes a buffer of whatever length a header claims, 4 GiB for a few bytes, and its DecodeString
// and Skip grow the decoder's own buffer, kept from one payload to the next, by a MiB each time
// a header claims more than the buffer holds. The result aliases the payload.
func (dec *Decoder) bytes() ([]byte, error) { return dec.take(dec.d.DecodeBytesLen()) }

// take passes over the payload's next n bytes and returns them, n and err as a length's header
// read them, and n checked against what the payload has left (length) first. The bytes alias the
// payload.
func (dec *Decoder) take(n int, err error) ([]byte, error) {
	if n, err = dec.length(n, err); err != nil {
		return nil, err
	}
	at := dec.pos()
	_, err = dec.r.Seek(int64(n), io.SeekCurrent) // the msgpack decoder reads on from there
	return dec.payload[at : at+n], err
}

// pos is where the decoder is in the payload.
func (dec *Decoder) pos() int { return len(dec.payload) - dec.r.Len() }

// str reads a byte or text string as a string of its own.
func (dec *Decoder) str() (string, error) {
	b, err := dec.bytes()
	return string(b), err
}

// skip passes over one value at depth depth, refusing arrays and maps nested past maxNesting.
func (dec *Decoder) skip(depth int) error {
	code, err := dec.d.PeekCode()
	if err != nil {
		return err
	}
	switch {
	case msgpcode.IsBin(code) || msgpcode.IsString(code):
		_, err := dec.bytes()
		return err
	case msgpcode.IsExt(code):
		_, n, err := dec.d.DecodeExtHeader()
		_, err = dec.take(n, err)
		return err
	case !isMap(code) && !isArray(code):
		return dec.d.Skip() // a number, nil or a bool: msgpack skips it in place
	}
	if depth >= maxNesting {
		return fmt.Errorf("arrays and maps nested deeper than %d", maxNesting)
	}
	var n int
	if isMap(code) {
		n, err = dec.length(dec.d.DecodeMapLen())
		n *= 2 // keys and values
	} else {
		n, err = dec.length(dec.d.DecodeArrayLen())
	}
	if err != nil {
		return err
	}
	for range n {
		if err := dec.skip(depth + 1); err != nil {
			return err
		}
	}
	return nil
}

// raw is the next value, at depth depth, as its msgpack bytes, copied out of the payload.
func (dec *Decoder) raw(depth int) ([]byte, error) {
	start := dec.pos()
	if err := dec.skip(depth); err != nil {
		return nil, err
	}
	return bytes.Clone(dec.payload[start:dec.pos()]), nil
}

func isArray(code byte) bool {
	return msgpcode.IsFixedArray(code) || code == msgpcode.Array16 || code == msgpcode.Array32
}

func isMap(code byte) bool {
	return msgpcode.IsFixedMap(code) || code == msgpcode.Map16 || code == msgpcode.Map32
}
