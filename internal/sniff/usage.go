// Package sniff reads what a worker's answer reports about itself while the relay passes it
// to the client, without holding the answer back or keeping it whole: the token usage (the
// prompt's tokens and those served from cache, for the access log and the policy's cache check)
// and the id of the response a worker stored (for the policy's map of stored responses). It
// knows the answers' JSON and event-stream shapes, and nothing of HTTP.
package sniff

import (
	"bytes"
	"sync"
)

// Usage finds the token usage a worker reported in its answer, for the access log: the
// last "usage" object of a JSON answer or a stream (chat's usage chunk, the Responses API's
// response.completed), or, for an Anthropic stream whose last usage counts only output, the one
// in message_start. It keeps the answer's first and last few KiB as they pass, never the whole
// answer, and never holds the relay back.
type Usage struct {
	head []byte // the first usageHead bytes
	ring []byte // the last usageTail bytes, circularly from next
	next int
	full bool
}

const (
	usageHead = 8 << 10
	usageTail = 16 << 10
)

// sniffers keeps the sniffers of finished answers: every routed answer has one, and its ring is
// too large to allocate per request.
var sniffers = sync.Pool{New: func() any { return &Usage{ring: make([]byte, usageTail)} }}

// NewUsage returns an empty usage sniffer; Release gives it back.
func NewUsage() *Usage { return sniffers.Get().(*Usage) }

// Release returns u to the pool, empty; u must not be used afterwards. A nil u does nothing.
func (u *Usage) Release() {
	if u == nil {
		return
	}
	u.head, u.next, u.full = u.head[:0], 0, false
	sniffers.Put(u)
}

// Tokens is what an answer's usage said of its prompt and output: the prompt's tokens, those
// served from the prefix cache, and the tokens generated. OK is false when it said nothing of the
// prompt, CachedKnown when it did not say how much of the prompt came from the cache.
type Tokens struct {
	Prompt, Cached, Output int
	OK, CachedKnown        bool
}

// Feed looks at the next bytes of the answer.
func (u *Usage) Feed(p []byte) {
	if room := usageHead - len(u.head); room > 0 {
		u.head = append(u.head, p[:min(room, len(p))]...)
	}
	if len(p) >= usageTail {
		copy(u.ring, p[len(p)-usageTail:])
		u.next, u.full = 0, true
		return
	}
	n := copy(u.ring[u.next:], p)
	if n < len(p) {
		copy(u.ring, p[n:])
		u.full = true
	}
	u.next = (u.next + len(p)) % usageTail
	if u.next == 0 && len(p) > 0 {
		u.full = true
	}
}

// tail is the last bytes of the answer, in order.
func (u *Usage) tail() []byte {
	if !u.full {
		return u.ring[:u.next]
	}
	return append(append([]byte(nil), u.ring[u.next:]...), u.ring[:u.next]...)
}

// UsageObject is a usage object of any of the three APIs' spellings, as far as it speaks of the
// prompt.
type UsageObject struct {
	PromptTokens        *int `json:"prompt_tokens"` // chat, completions
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	InputTokens        *int `json:"input_tokens"` // Responses; Messages (without cache reads)
	InputTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	CacheRead     *int `json:"cache_read_input_tokens"` // Messages
	CacheCreation *int `json:"cache_creation_input_tokens"`
	Completion    int  `json:"completion_tokens"` // chat, completions
	Output        int  `json:"output_tokens"`     // Responses, Messages
}

// Tokens returns what the usage reports of the prompt, if it reports a prompt. The cached count
// is known only when the answer carries it: vLLM leaves prompt_tokens_details out unless it
// runs with --enable-prompt-tokens-details, and no count is not zero cached.
func (u *UsageObject) Tokens() (r Tokens) {
	switch {
	case u.PromptTokens != nil:
		r = Tokens{Prompt: *u.PromptTokens, OK: true, CachedKnown: u.PromptTokensDetails != nil}
		if r.CachedKnown {
			r.Cached = u.PromptTokensDetails.CachedTokens
		}
	case u.InputTokens != nil && (u.CacheRead != nil || u.CacheCreation != nil):
		read, created := deref(u.CacheRead), deref(u.CacheCreation)
		r = Tokens{Prompt: *u.InputTokens + read + created, Cached: read, OK: true, CachedKnown: u.CacheRead != nil}
	case u.InputTokens != nil:
		r = Tokens{Prompt: *u.InputTokens, OK: true, CachedKnown: u.InputTokensDetails != nil}
		if r.CachedKnown {
			r.Cached = u.InputTokensDetails.CachedTokens
		}
	}
	r.Output = max(u.Completion, u.Output, 0)
	return r
}

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// Result returns what the answer's usage said of its prompt and output (OK is false when it
// reported no prompt).
func (u *Usage) Result() Tokens {
	tail := lastUsage(u.tail())
	if tail.OK {
		return tail
	}
	r := lastUsage(u.head)
	r.Output = max(r.Output, tail.Output)
	return r
}

// objectAt returns the JSON object data starts with (after white space), up to its closing
// brace, found by its brackets outside strings; ok is false when it does not close.
func objectAt(data []byte) (obj []byte, ok bool) {
	data = bytes.TrimLeft(data, " \t\r\n")
	if len(data) == 0 || data[0] != '{' {
		return nil, false
	}
	depth, inString := 0, false
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			if depth--; depth == 0 {
				return data[:i+1], true
			}
		}
	}
	return nil, false
}

// lastUsage reads the last "usage" object in data that reports a prompt, with the output tokens
// of the last usage object of all (an Anthropic stream counts its output once more at its end,
// in a usage without the prompt).
func lastUsage(data []byte) Tokens { return lastUsageBy(data, readUsageAt) }

// lastUsageBy is lastUsage reading each usage object, which follows its key's colon, with read.
func lastUsageBy(data []byte, read func([]byte) (Tokens, bool)) Tokens {
	key := []byte(`"usage"`)
	output, last := 0, true
	for end := len(data); ; {
		i := bytes.LastIndex(data[:end], key)
		if i < 0 {
			return Tokens{Output: output} // no prompt reported: OK is false
		}
		end = i
		rest := bytes.TrimLeft(data[i+len(key):], " \t\r\n")
		if len(rest) == 0 || rest[0] != ':' {
			continue
		}
		r, ok := read(rest[1:])
		if !ok {
			continue
		}
		if last {
			output, last = r.Output, false
		}
		if r.OK {
			r.Output = max(r.Output, output)
			return r
		}
	}
}
