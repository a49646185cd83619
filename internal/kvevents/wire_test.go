package kvevents

import (
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// The tests write payloads as vLLM's publishers do, in either encoding: positional arrays whose
// events start with their tag (msgspec's array_like), or maps with the tag under "type".

// stored is a BlockStored as a test writes it; hashes are ints or []byte.
type wireStored struct {
	hashes    []any
	parent    any // nil for none
	tokens    []int
	blockSize int
	loraID    any // nil for none
	medium    any // nil, "GPU", "CPU"
	loraName  any // nil or a string
	extraKeys any // nil or []any of per-block tuples ([]any) or nil
}

type wireRemoved struct {
	hashes []any
	medium any
}

type wireCleared struct{}

func encodeArrays(t testing.TB, dpRank any, events ...any) []byte {
	t.Helper()
	evs := make([]any, 0, len(events))
	for _, e := range events {
		switch e := e.(type) {
		case wireStored:
			evs = append(evs, []any{"BlockStored", e.hashes, e.parent, e.tokens, e.blockSize, e.loraID, e.medium, e.loraName, e.extraKeys})
		case wireRemoved:
			evs = append(evs, []any{"BlockRemoved", e.hashes, e.medium})
		case wireCleared:
			evs = append(evs, []any{"AllBlocksCleared"})
		default:
			evs = append(evs, e)
		}
	}
	b, err := msgpack.Marshal([]any{1733000000.25, evs, dpRank})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func encodeMaps(t testing.TB, dpRank any, events ...any) []byte {
	t.Helper()
	evs := make([]any, 0, len(events))
	for _, e := range events {
		switch e := e.(type) {
		case wireStored:
			evs = append(evs, map[string]any{"type": "BlockStored", "block_hashes": e.hashes, "parent_block_hash": e.parent,
				"token_ids": e.tokens, "block_size": e.blockSize, "lora_id": e.loraID, "medium": e.medium,
				"lora_name": e.loraName, "extra_keys": e.extraKeys})
		case wireRemoved:
			evs = append(evs, map[string]any{"type": "BlockRemoved", "block_hashes": e.hashes, "medium": e.medium})
		case wireCleared:
			evs = append(evs, map[string]any{"type": "AllBlocksCleared"})
		default:
			evs = append(evs, e)
		}
	}
	batch := map[string]any{"ts": 1733000000.25, "events": evs}
	if dpRank != nil {
		batch["data_parallel_rank"] = dpRank
	}
	b, err := msgpack.Marshal(batch)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// seq returns n consecutive token ids from start.
func seq(start, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = start + i
	}
	return out
}

func u32(ints []int) []uint32 {
	out := make([]uint32, len(ints))
	for i, v := range ints {
		out[i] = uint32(v)
	}
	return out
}

func decode(t testing.TB, payload []byte) Batch {
	t.Helper()
	b, err := NewDecoder().Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
