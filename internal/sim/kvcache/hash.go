package kvcache

import "encoding/binary"

// Block hashes are chained as in vLLM's automatic prefix caching: the hash
// of block k covers the bytes of blocks 0..k, so two streams share the hash
// of block k only if they agree on everything up to its end.
//
// The mixer reads eight bytes at a time and is not cryptographic: it needs
// only to be deterministic across processes and cheap, because every request
// hashes its whole prompt and reply.

const (
	hashSeed  = 0x9E3779B97F4A7C15
	hashPrime = 0xBF58476D1CE4E5B9
)

// mix folds one 64-bit word into h.
func mix(h, w uint64) uint64 {
	h ^= w
	h *= hashPrime
	h ^= h >> 31
	return h
}

// foldBytes folds b into h.
func foldBytes(h uint64, b []byte) uint64 {
	for len(b) >= 8 {
		h = mix(h, binary.LittleEndian.Uint64(b))
		b = b[8:]
	}
	if len(b) > 0 {
		var tail [8]byte
		copy(tail[:], b)
		h = mix(h, binary.LittleEndian.Uint64(tail[:])^uint64(len(b))<<59)
	}
	return h
}

// Root is where the chain of a stream's block hashes starts: the same for every
// base-model stream, and one of its own for each LoRA adapter, by name, as vLLM
// folds the adapter's name into every block hash of a request for it. So an
// adapter's blocks never serve the base model or another adapter, and an adapter
// unloaded and loaded again under its name finds its blocks still cached.
func Root(lora string) uint64 {
	if lora == "" {
		return hashSeed
	}
	return HashBytes([]byte(lora))
}

// BlockHashes appends to dst the chained hash of every full block of the
// token stream whose bytes are text and whose token end offsets are ends
// (token i covers text[ends[i-1]:ends[i]]), the chain starting at root (Root).
// A trailing partial block is not hashed: like vLLM, the cache holds full
// blocks only.
func BlockHashes(dst []uint64, root uint64, text []byte, ends []int32, blockSize int) []uint64 {
	h := root
	start := 0
	for k := blockSize; k <= len(ends); k += blockSize {
		end := int(ends[k-1])
		h = foldBytes(h, text[start:end])
		// Fold in the block's byte length so the boundaries count too.
		h = mix(h, uint64(end-start))
		dst = append(dst, h)
		start = end
	}
	return dst
}

// HashBytes returns a hash of b with the same mixer; the simulator seeds its
// output text with it.
func HashBytes(b []byte) uint64 {
	return mix(foldBytes(hashSeed, b), uint64(len(b)))
}
