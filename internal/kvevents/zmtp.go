package kvevents

import (
	"encoding/binary"
	"fmt"
)

// zmtp.go follows the bytes an event peer sends through ZMTP 3's framing (rfc.zeromq.org/spec/23)
// so that a connection breaking a bound is failed before anything is allocated for it: zmq4 reads
// a frame by allocating the size its header announces, whatever it is (a header announcing 2^62
// bytes crashed the process), and gathers a message's frames without limit. A connection opens
// with a 64-byte greeting; then come frames, each a flags byte (MORE 0x01: another frame of the
// message follows; LONG 0x02: the size takes 8 big-endian bytes, else 1; COMMAND 0x04: a ZMTP
// command such as the NULL mechanism's READY), the size, and that many bytes of body.

// MaxMessageBytes bounds one message from an event peer, its frames' bodies together. An engine
// sends one batch per scheduler step, a few hundred KiB for a step that stores 100,000 tokens'
// blocks (5 bytes a token id, 9 a block hash); 16 MiB holds a 1M-token prefill in one step with
// room to spare. A peer announcing more has its connection closed before zmq4 allocates.
const MaxMessageBytes = 16 << 20

const (
	// maxMessageFrames bounds the frames of one message: an event has three (topic, sequence,
	// payload), a replay answer three behind the ROUTER's empty delimiter.
	maxMessageFrames = 8
	// maxCommandBytes bounds one ZMTP command: READY carries a socket type and an identity of at
	// most 255 bytes.
	maxCommandBytes = 4 << 10
	// greetingBytes is the length of a ZMTP 3 greeting.
	greetingBytes = 64

	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

// framing is where a connection's bytes are in ZMTP's framing, fed as they are read.
type framing struct {
	greeting  int     // greeting bytes seen
	header    [9]byte // the current frame's header, headerLen bytes of it seen
	headerLen int
	body      uint64 // body bytes of the current frame still to come
	more      bool   // the current frame has MORE set
	frames    int    // frames of the current message so far
	bytes     uint64 // their bodies' bytes
	commands  int    // commands received whole; the handshake is done after the first (READY)
	command   bool   // the current frame is a command
}

// feed follows b, the next bytes of the connection, and reports the first bound they break: a
// header announcing a frame that would take its message past MaxMessageBytes or
// maxMessageFrames, or a command past maxCommandBytes. It fails at the byte that completes such a
// header; the bytes before it were within bounds.
func (f *framing) feed(b []byte) error {
	for len(b) > 0 {
		switch {
		case f.greeting < greetingBytes:
			n := min(len(b), greetingBytes-f.greeting)
			f.greeting += n
			b = b[n:]
		case f.body > 0:
			n := min(uint64(len(b)), f.body)
			f.body -= n
			b = b[n:]
			if f.body == 0 {
				f.endFrame()
			}
		default:
			f.header[f.headerLen] = b[0]
			f.headerLen++
			b = b[1:]
			if f.headerLen < headerLen(f.header[0]) {
				continue
			}
			if err := f.startFrame(); err != nil {
				return err
			}
		}
	}
	return nil
}

// headerLen is the length of a frame header whose flags byte is flags.
func headerLen(flags byte) int {
	if flags&flagLong != 0 {
		return 9
	}
	return 2
}

// startFrame checks the header just completed against the bounds and begins its body.
func (f *framing) startFrame() error {
	flags := f.header[0]
	size := uint64(f.header[1])
	if flags&flagLong != 0 {
		size = binary.BigEndian.Uint64(f.header[1:9])
	}
	f.headerLen = 0
	f.command = flags&flagCommand != 0
	switch {
	case f.command && size > maxCommandBytes:
		return fmt.Errorf("a ZMTP command of %d bytes, over %d", size, maxCommandBytes)
	case f.frames >= maxMessageFrames:
		return fmt.Errorf("a message of more than %d frames", maxMessageFrames)
	case size > MaxMessageBytes-f.bytes:
		return fmt.Errorf("a frame of %d bytes in a message of %d bytes so far, over %d", size, f.bytes, MaxMessageBytes)
	}
	f.frames++
	f.bytes += size
	f.more = flags&flagMore != 0
	f.body = size
	if size == 0 {
		f.endFrame()
	}
	return nil
}

// endFrame closes the frame whose body is complete, and its message when it was the last frame.
func (f *framing) endFrame() {
	if f.command {
		f.commands++
	}
	if !f.more {
		f.frames, f.bytes = 0, 0
	}
}

// handshaken reports whether the peer has sent its greeting and a command whole: the NULL
// mechanism's READY, the end of its handshake.
func (f *framing) handshaken() bool { return f.commands > 0 }
