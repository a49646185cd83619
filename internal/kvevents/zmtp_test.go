package kvevents

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/cacheroute/cacheroute/internal/kvevents/kvtest"
)

// stream is a connection's bytes from a publisher: the greeting, READY, then frames.
func stream(frames ...[]byte) []byte {
	s := append(kvtest.Greeting(), kvtest.Ready("PUB")...)
	for _, f := range frames {
		s = append(s, f...)
	}
	return s
}

// frame is one frame with its header and body.
func frame(flags byte, body []byte) []byte {
	return append(kvtest.FrameHeader(flags, uint64(len(body))), body...)
}

// firstBreak walks s, a connection's bytes, frame by frame and returns the offset of the byte that
// completes the first header over a bound, or -1: the reference the framing is held to.
func firstBreak(s []byte) int {
	i := min(len(s), greetingBytes)
	frames, total := 0, uint64(0)
	for i < len(s) {
		flags := s[i]
		n := 2
		if flags&flagLong != 0 {
			n = 9
		}
		if i+n > len(s) {
			return -1
		}
		size := uint64(s[i+1])
		if n == 9 {
			size = binary.BigEndian.Uint64(s[i+1 : i+9])
		}
		if (flags&flagCommand != 0 && size > maxCommandBytes) || frames == maxMessageFrames || size > MaxMessageBytes || total+size > MaxMessageBytes {
			return i + n - 1
		}
		frames, total, i = frames+1, total+size, i+n
		if uint64(len(s)-i) < size {
			return -1
		}
		i += int(size)
		if flags&flagMore == 0 {
			frames, total = 0, 0
		}
	}
	return -1
}

// feedBytewise feeds s one byte at a time and returns the offset of the byte at which the framing
// failed, or -1.
func feedBytewise(s []byte) int {
	var f framing
	for i := range s {
		if f.feed(s[i:i+1]) != nil {
			return i
		}
	}
	return -1
}

func TestFramingFailsAtTheHeaderThatBreaksABound(t *testing.T) {
	event := [][]byte{frame(flagMore, []byte("kv@test")), frame(flagMore, make([]byte, 8)), frame(0, []byte("payload"))}
	half := make([]byte, MaxMessageBytes/2)
	cases := []struct {
		name string
		s    []byte
		ok   bool
	}{
		{"an event message, twice", stream(append(event, event...)...), true},
		{"a message of exactly the bound", stream(frame(flagMore, half), frame(0, half)), true},
		{"a frame announcing 2^62 bytes", stream(kvtest.FrameHeader(0, 1<<62)), false},
		{"a frame announcing 2^64-1 bytes", stream(kvtest.FrameHeader(0, 1<<64-1)), false},
		{"a frame one byte over", stream(kvtest.FrameHeader(0, MaxMessageBytes+1)), false},
		{"two frames one byte over", stream(frame(flagMore, half), kvtest.FrameHeader(0, MaxMessageBytes/2+1)), false},
		{"a message of maxMessageFrames", stream(bytes.Repeat(frame(flagMore, nil), maxMessageFrames-1), frame(0, nil)), true},
		{"a message of one frame more", stream(bytes.Repeat(frame(flagMore, nil), maxMessageFrames), frame(0, nil)), false},
		{"frames of a message that ended do not count for the next", stream(bytes.Repeat(frame(0, nil), 3*maxMessageFrames)), true},
		{"a command over its bound", stream(kvtest.FrameHeader(flagCommand, maxCommandBytes+1)), false},
	}
	for _, c := range cases {
		want := firstBreak(c.s)
		if (want < 0) != c.ok {
			t.Fatalf("%s: the reference says %d", c.name, want)
		}
		var f framing
		if err := f.feed(c.s); (err == nil) != c.ok {
			t.Errorf("%s: fed whole, err %v", c.name, err)
		}
		if got := feedBytewise(c.s); got != want {
			t.Errorf("%s: fed byte by byte, failed at %d, want %d", c.name, got, want)
		}
	}
}

// The framing of a connection's bytes fails exactly where the reference walk finds the first
// header over a bound, however the bytes are split into reads, and never before the handshake's
// greeting is complete.
func FuzzFraming(f *testing.F) {
	f.Add(stream(frame(flagMore, []byte("kv@test")), frame(flagMore, make([]byte, 8)), frame(0, []byte("payload"))), uint8(7))
	f.Add(stream(kvtest.FrameHeader(0, 1<<62)), uint8(1))
	f.Add(stream(kvtest.FrameHeader(flagMore, 300), make([]byte, 300), kvtest.FrameHeader(0, MaxMessageBytes-299)), uint8(3))
	f.Add(stream(bytes.Repeat(frame(flagMore, []byte{1}), 2*maxMessageFrames)), uint8(2))
	f.Add(stream(kvtest.FrameHeader(flagCommand|flagMore, 5), []byte("PING\x00"), kvtest.FrameHeader(0, 1)), uint8(5))
	f.Add(kvtest.Greeting()[:30], uint8(4))
	f.Fuzz(func(t *testing.T, s []byte, chunk uint8) {
		want := firstBreak(s)
		if got := feedBytewise(s); got != want {
			t.Fatalf("fed byte by byte: failed at %d, want %d", got, want)
		}
		var f framing
		step := int(chunk%64) + 1
		failedAt := -1
		for i := 0; i < len(s); i += step {
			if f.feed(s[i:min(i+step, len(s))]) != nil {
				failedAt = i
				break
			}
		}
		if (failedAt < 0) != (want < 0) || (want >= 0 && (want < failedAt || want >= failedAt+step)) {
			t.Fatalf("fed %d bytes at a time: failed in the read at %d, want the one holding %d", step, failedAt, want)
		}
		if want >= 0 && want < greetingBytes {
			t.Fatalf("failed at %d, inside the greeting", want)
		}
	})
}
