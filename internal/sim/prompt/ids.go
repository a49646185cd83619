package prompt

// ids.go gives every pseudo-token an id, so that the simulator can answer /tokenize and publish
// KV-cache events with token ids as a real engine does. There is no vocabulary: a token's id is
// a function of its bytes alone, so equal tokens always get equal ids, in every process and on
// every worker, and a router that chains keys over the ids of /tokenize matches the blocks the
// worker published.
//
// A token that is a space followed by the canonical decimal digits of n < 2^31 (how RenderIDs
// renders a token-id prompt's id n) has id n, so a token-id prompt publishes the ids it was sent.
// Every other token's id is a 31-bit FNV-1a hash of its bytes with the top bit set, so the two
// kinds never share an id. Two distinct tokens of the second kind share an id with probability
// 2^-31; the cache itself hashes bytes, not ids, so such a collision could only make a router
// that keys blocks by ids credit a block it should not, and needs every token of the block to
// collide.

const (
	fnvOffset32 = 2166136261
	fnvPrime32  = 16777619
	hashedBit   = 1 << 31
)

// TokenID returns the id of the token whose bytes are tok.
func TokenID[T string | []byte](tok T) uint32 {
	if n, ok := decimalID(tok); ok {
		return n
	}
	h := uint32(fnvOffset32)
	for i := 0; i < len(tok); i++ {
		h ^= uint32(tok[i])
		h *= fnvPrime32
	}
	return h | hashedBit
}

// decimalID reads " <n>" with n canonical (no leading zero unless n is 0) and below 2^31.
func decimalID[T string | []byte](tok T) (uint32, bool) {
	if len(tok) < 2 || len(tok) > 11 || tok[0] != ' ' || (tok[1] == '0' && len(tok) > 2) {
		return 0, false
	}
	var n uint64
	for i := 1; i < len(tok); i++ {
		c := tok[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	if n >= hashedBit {
		return 0, false
	}
	return uint32(n), true
}

// AppendIDs appends to dst the ids of tokens from..to-1 of s.
func (s *Sequence) AppendIDs(dst []uint32, from, to int) []uint32 {
	start := 0
	if from > 0 {
		start = int(s.Ends[from-1])
	}
	for i := from; i < to; i++ {
		end := int(s.Ends[i])
		dst = append(dst, TokenID(s.Text[start:end]))
		start = end
	}
	return dst
}

// Token returns the bytes of token i of s.
func (s *Sequence) Token(i int) []byte {
	start := 0
	if i > 0 {
		start = int(s.Ends[i-1])
	}
	return s.Text[start:s.Ends[i]]
}
