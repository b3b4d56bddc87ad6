package fatbin

import (
	"encoding/binary"
)

// BuildContainer writes one fat binary container holding the given entries,
// each with a payload of payloadSize filler bytes (rounded up to 8). It
// produces the layout ParseSection and Scan read; kiln's tests and
// benchmark build their CUDA-shaped binaries with it.
func BuildContainer(entries []Entry, payloadSize int) []byte {
	padded := (payloadSize + 7) &^ 7
	var body []byte
	for i, e := range entries {
		h := make([]byte, 64)
		binary.LittleEndian.PutUint16(h[0:], uint16(e.Kind))
		binary.LittleEndian.PutUint16(h[2:], 0x0101)
		binary.LittleEndian.PutUint32(h[4:], 64)
		binary.LittleEndian.PutUint64(h[8:], uint64(padded))
		binary.LittleEndian.PutUint32(h[16:], uint32(payloadSize))
		binary.LittleEndian.PutUint32(h[28:], uint32(e.Arch))
		body = append(body, h...)
		p := make([]byte, padded)
		for j := range p[:payloadSize] {
			p[j] = byte(i*31 + j*7 + 1)
		}
		body = append(body, p...)
	}
	out := make([]byte, containerHeaderSize, containerHeaderSize+len(body))
	binary.LittleEndian.PutUint32(out[0:], Magic)
	binary.LittleEndian.PutUint16(out[4:], 1)
	binary.LittleEndian.PutUint16(out[6:], containerHeaderSize)
	binary.LittleEndian.PutUint64(out[8:], uint64(len(body)))
	return append(out, body...)
}

// BuildELF writes a small little-endian ELF64 shared object with a .text
// section holding text and, when fatbin is not nil, a .nv_fatbin section
// holding it; the section header table is at the end, as linkers write it.
func BuildELF(text, fatbin []byte) []byte {
	type sec struct {
		name  string
		typ   uint32
		flags uint64
		data  []byte
		align uint64
	}
	secs := []sec{{name: ".text", typ: 1, flags: 6, data: text, align: 16}}
	if fatbin != nil {
		secs = append(secs, sec{name: ".nv_fatbin", typ: 1, flags: 2, data: fatbin, align: 8})
	}
	shstr := []byte{0}
	nameOff := make([]uint32, len(secs)+1)
	for i, s := range secs {
		nameOff[i] = uint32(len(shstr))
		shstr = append(append(shstr, s.name...), 0)
	}
	nameOff[len(secs)] = uint32(len(shstr))
	shstr = append(append(shstr, ".shstrtab"...), 0)
	secs = append(secs, sec{name: ".shstrtab", typ: 3, data: shstr, align: 1})

	buf := make([]byte, 64)
	offs := make([]uint64, len(secs))
	for i, s := range secs {
		for uint64(len(buf))%s.align != 0 {
			buf = append(buf, 0)
		}
		offs[i] = uint64(len(buf))
		buf = append(buf, s.data...)
	}
	for len(buf)%8 != 0 {
		buf = append(buf, 0)
	}
	shoff := uint64(len(buf))
	buf = append(buf, make([]byte, 64)...) // the null section
	for i, s := range secs {
		h := make([]byte, 64)
		binary.LittleEndian.PutUint32(h[0:], nameOff[i])
		binary.LittleEndian.PutUint32(h[4:], s.typ)
		binary.LittleEndian.PutUint64(h[8:], s.flags)
		binary.LittleEndian.PutUint64(h[24:], offs[i])
		binary.LittleEndian.PutUint64(h[32:], uint64(len(s.data)))
		binary.LittleEndian.PutUint64(h[48:], s.align)
		buf = append(buf, h...)
	}
	copy(buf[0:], "\x7fELF")
	buf[4], buf[5], buf[6] = 2, 1, 1            // ELF64, little endian, version 1
	binary.LittleEndian.PutUint16(buf[16:], 3)  // ET_DYN
	binary.LittleEndian.PutUint16(buf[18:], 62) // EM_X86_64
	binary.LittleEndian.PutUint32(buf[20:], 1)
	binary.LittleEndian.PutUint64(buf[0x28:], shoff)
	binary.LittleEndian.PutUint16(buf[0x34:], 64) // e_ehsize
	binary.LittleEndian.PutUint16(buf[0x3a:], 64) // e_shentsize
	binary.LittleEndian.PutUint16(buf[0x3c:], uint16(len(secs)+1))
	binary.LittleEndian.PutUint16(buf[0x3e:], uint16(len(secs))) // .shstrtab is last
	return buf
}
