package elfsect

import "encoding/binary"

// Build writes a small little-endian x86-64 ELF64 shared object with a
// .text section holding text and, when data is not nil, a section called
// name holding it, aligned to align bytes; the section header table is at
// the end, as linkers write it. kiln's tests and benchmarks build their
// GPU-shaped binaries with it (through fatbin.BuildELF and
// offload.BuildELF).
func Build(text []byte, name string, data []byte, align uint64) []byte {
	type sec struct {
		name  string
		typ   uint32
		flags uint64
		data  []byte
		align uint64
	}
	secs := []sec{{name: ".text", typ: 1, flags: 6, data: text, align: 16}}
	if data != nil {
		secs = append(secs, sec{name: name, typ: 1, flags: 2, data: data, align: max(align, 1)})
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
