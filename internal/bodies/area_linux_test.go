package bodies

import (
	"bytes"
	"testing"
	"unsafe"
)

// A body's mapping given back is the next fitting body's, which sees only its own bytes; a body
// needing more room than any spare gets a mapping of its own.
func TestBodyRelease_KeepsTheMappingForTheNextBody(t *testing.T) {
	b := NewBudget(0, 0)
	first := bytes.Repeat([]byte("a"), 100<<10)
	h, err := b.Read(bytes.NewReader(first), "c", len(first), len(first), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !h.area.mapped {
		t.Fatal("a 100 KiB body was not read into a mapping")
	}
	at := &h.area.b[0]
	h.Release()

	second := bytes.Repeat([]byte("b"), 90<<10)
	h, err = b.Read(bytes.NewReader(second), "c", len(second), len(second), nil)
	if err != nil {
		t.Fatal(err)
	}
	if &h.area.b[0] != at {
		t.Error("the second body did not reuse the first one's mapping")
	}
	if !bytes.Equal(h.Bytes(), second) {
		t.Errorf("the second body reads %d bytes, not its own %d", len(h.Bytes()), len(second))
	}

	big := bytes.Repeat([]byte("c"), 1<<20)
	h2, err := b.Read(bytes.NewReader(big), "c", len(big), len(big), nil)
	if err != nil {
		t.Fatal(err)
	}
	if &h2.area.b[0] == at || len(h2.area.b) < len(big) {
		t.Error("a body larger than the spare mapping was given it")
	}
	releaseAll(t, b, h, h2)
}

// The mappings kept for reuse stay within their bounds: at most maxSpares of them, holding at most
// maxSpareBytes of written pages together; the rest are unmapped.
func TestBodyRelease_KeepsSparesWithinTheirBounds(t *testing.T) {
	b := NewBudget(0, 0)
	var held []*Body
	body := bytes.Repeat([]byte("x"), 1<<20)
	for range maxSpares + 8 {
		h, err := b.Read(bytes.NewReader(body), "c", len(body), len(body), nil)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, h)
	}
	for _, h := range held {
		h.Release()
	}
	b.spares.mu.Lock()
	n, backed := len(b.spares.areas), b.spares.backed
	b.spares.mu.Unlock()
	if n > maxSpares || backed > maxSpareBytes {
		t.Errorf("%d spares back %d bytes; bounds are %d and %d", n, backed, maxSpares, maxSpareBytes)
	}
	if want := maxSpareBytes / (1 << 20); n != want {
		t.Errorf("%d spares of 1 MiB kept, want %d (the byte bound)", n, want)
	}
}

// Memory for what routing derives from a mapped body comes after the body in its own mapping,
// which has room for twice the body there, and a small body's after it in its kept buffer; more
// than that room gets heap memory.
func TestScratch_OfAMappedBodyIsTheRoomAfterItsBytes(t *testing.T) {
	b := NewBudget(0, 0)
	body := bytes.Repeat([]byte("a"), 100<<10)
	h, err := b.Read(bytes.NewReader(body), "c", len(body), len(body), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	within := func(p []byte, area []byte) bool {
		start := &area[0]
		return cap(p) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(p))) >= uintptr(unsafe.Pointer(start)) &&
			uintptr(unsafe.Pointer(unsafe.SliceData(p)))+uintptr(cap(p)) <= uintptr(unsafe.Pointer(start))+uintptr(len(area))
	}
	key := h.Scratch(2 * len(body))
	if len(key) != 0 || cap(key) < 2*len(body) || !within(key, h.area.b[len(body):]) {
		t.Errorf("scratch of twice a mapped body (len %d, cap %d) is not the room after it", len(key), cap(key))
	}
	_ = append(key, "key"...)
	if !bytes.Equal(h.Bytes(), body) {
		t.Error("writing the scratch memory changed the body")
	}
	if big := h.Scratch(len(h.area.b)); within(big, h.area.b) {
		t.Error("scratch larger than the mapping's room was given the mapping")
	}

	small := []byte(`{"model":"m"}`)
	s, err := b.Read(bytes.NewReader(small), "c", len(small), len(small), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release()
	kept := *s.area.kept
	p := s.Scratch(64)
	if len(p) != 0 || cap(p) < 64 || !within(p, kept[len(small):]) {
		t.Errorf("scratch of a small body (len %d, cap %d) is not the room after it in its buffer", len(p), cap(p))
	}
	_ = append(p, "key"...)
	if !bytes.Equal(s.Bytes(), small) {
		t.Error("writing the scratch memory changed the small body")
	}
	if big := s.Scratch(len(kept)); within(big, kept) {
		t.Error("scratch larger than a small body's room was given its buffer")
	}
}
