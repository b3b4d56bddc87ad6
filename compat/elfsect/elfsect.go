// Package elfsect finds an ELF file's sections while the file passes as a
// stream: it reads the file header, keeps the section header table and the
// bytes just before it (where linkers put .shstrtab) as they go by, and at
// the end says where the sections of a name lie. kiln's readers of GPU code
// (compat/fatbin for .nv_fatbin, compat/offload for .hip_fatbin) read files
// of a gigabyte this way, with the table as their only memory that grows.
package elfsect

import (
	"bytes"
	"encoding/binary"
	"errors"
)

// ErrNotELF is returned for input that is not a little-endian ELF file.
var ErrNotELF = errors.New("not a little-endian ELF file")

const (
	// preWindow is how much of the file just before the section header
	// table is kept, to read the section names.
	preWindow = 64 << 10
	// maxTable bounds the section header table kept in memory.
	maxTable = 4 << 20
)

// Header is what kiln reads of an ELF file header.
type Header struct {
	Is64       bool
	OSABI      uint8
	ABIVersion uint8
	Machine    uint16
	Flags      uint32

	shoff                      uint64
	shentsize, shnum, shstrndx uint16
}

// ParseHeader reads the file header at the start of b (64 bytes are
// enough).
func ParseHeader(b []byte) (Header, error) {
	if len(b) < 52 || !bytes.HasPrefix(b, []byte("\x7fELF")) || b[5] != 1 {
		return Header{}, ErrNotELF
	}
	h := Header{OSABI: b[7], ABIVersion: b[8], Machine: binary.LittleEndian.Uint16(b[0x12:])}
	switch b[4] {
	case 1:
		h.Flags = binary.LittleEndian.Uint32(b[0x24:])
		h.shoff = uint64(binary.LittleEndian.Uint32(b[0x20:]))
		h.shentsize = binary.LittleEndian.Uint16(b[0x2e:])
		h.shnum = binary.LittleEndian.Uint16(b[0x30:])
		h.shstrndx = binary.LittleEndian.Uint16(b[0x32:])
	case 2:
		if len(b) < 64 {
			return Header{}, ErrNotELF
		}
		h.Is64 = true
		h.Flags = binary.LittleEndian.Uint32(b[0x30:])
		h.shoff = binary.LittleEndian.Uint64(b[0x28:])
		h.shentsize = binary.LittleEndian.Uint16(b[0x3a:])
		h.shnum = binary.LittleEndian.Uint16(b[0x3c:])
		h.shstrndx = binary.LittleEndian.Uint16(b[0x3e:])
	default:
		return Header{}, ErrNotELF
	}
	return h, nil
}

// Class is e_ident[EI_CLASS]: 1 for ELF32, 2 for ELF64.
func (h Header) Class() uint8 {
	if h.Is64 {
		return 2
	}
	return 1
}

type window struct {
	start, end int64
	buf        []byte
	got        int64 // bytes copied
}

func (w *window) keep(pos int64, b []byte) {
	lo, hi := max(pos, w.start), min(pos+int64(len(b)), w.end)
	if lo < hi {
		copy(w.buf[lo-w.start:], b[lo-pos:hi-pos])
		w.got += hi - lo
	}
}

func (w *window) full() bool { return w.got == int64(len(w.buf)) }

// Tables keeps the section header table and the bytes before it as the
// file streams past.
type Tables struct {
	h        Header
	sht, pre window
}

// NewTables prepares to keep the tables of a file of size bytes (-1 when
// unknown). It returns nil when the header's table is not plausible; a nil
// Tables keeps nothing and finds no section.
func NewTables(h Header, size int64) *Tables {
	want := uint16(40)
	if h.Is64 {
		want = 64
	}
	n := uint64(h.shentsize) * uint64(h.shnum)
	if h.shentsize != want || h.shnum == 0 || h.shoff < 64 || h.shoff >= 1<<62 || n > maxTable ||
		(size >= 0 && h.shoff+n > uint64(size)) {
		return nil
	}
	t := &Tables{h: h}
	t.sht = window{start: int64(h.shoff), end: int64(h.shoff + n), buf: make([]byte, n)}
	ps := max(int64(h.shoff)-preWindow, 64)
	t.pre = window{start: ps, end: int64(h.shoff), buf: make([]byte, max(int64(h.shoff)-ps, 0))}
	return t
}

// Keep copies what the tables want of b, the bytes at file offset pos.
func (t *Tables) Keep(pos int64, b []byte) {
	if t == nil {
		return
	}
	t.sht.keep(pos, b)
	t.pre.keep(pos, b)
}

// Sections returns the file ranges [start, end) of the sections called
// name. ok is false when the table or the section names were not kept
// whole (a stream cut short, names outside the window before the table).
func (t *Tables) Sections(name string) (ranges [][2]int64, ok bool) {
	if t == nil || !t.sht.full() || !t.pre.full() {
		return nil, false
	}
	type sec struct {
		name      uint32
		off, size uint64
	}
	ent := int(t.h.shentsize)
	read := func(i int) sec {
		b := t.sht.buf[i*ent:]
		if t.h.Is64 {
			return sec{binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint64(b[24:]), binary.LittleEndian.Uint64(b[32:])}
		}
		return sec{binary.LittleEndian.Uint32(b), uint64(binary.LittleEndian.Uint32(b[16:])), uint64(binary.LittleEndian.Uint32(b[20:]))}
	}
	n := len(t.sht.buf) / ent
	strndx := int(t.h.shstrndx)
	if strndx <= 0 || strndx >= n {
		return nil, false
	}
	st := read(strndx)
	pre := t.pre
	if st.off < uint64(pre.start) || st.size > uint64(pre.end) || st.off+st.size > uint64(pre.end) {
		return nil, false
	}
	names := pre.buf[st.off-uint64(pre.start) : st.off-uint64(pre.start)+st.size]
	for i := 1; i < n; i++ {
		s := read(i)
		if uint64(s.name) >= uint64(len(names)) {
			continue
		}
		nm := names[s.name:]
		if j := bytes.IndexByte(nm, 0); j >= 0 {
			nm = nm[:j]
		}
		if string(nm) == name && s.off < 1<<62 && s.size < 1<<62 {
			ranges = append(ranges, [2]int64{int64(s.off), int64(s.off + s.size)})
		}
	}
	return ranges, true
}

// Find returns the range of ranges that holds off.
func Find(ranges [][2]int64, off int64) ([2]int64, bool) {
	for _, r := range ranges {
		if off >= r[0] && off < r[1] {
			return r, true
		}
	}
	return [2]int64{}, false
}
