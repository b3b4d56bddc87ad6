package offload

import (
	"bytes"
	"compress/zlib"
	"crypto/md5"
	"encoding/binary"
	"fmt"

	"github.com/klauspost/compress/zstd"

	"kiln.dev/kiln/compat/elfsect"
)

// BundleEntry is one entry of a bundle to build: its id and code object.
type BundleEntry struct {
	ID     string
	Object []byte
}

// BuildBundle writes an uncompressed offload bundle holding entries, with
// each code object aligned to align bytes (clang-offload-bundler
// -bundle-align; HIP uses 4096), the layout Scan reads. kiln's tests and
// benchmarks build their HIP-shaped binaries with it.
func BuildBundle(entries []BundleEntry, align int) []byte {
	align = max(align, 1)
	hdr := uint64(bundleFixed)
	for _, e := range entries {
		hdr += entryFixed + uint64(len(e.ID))
	}
	offs := make([]uint64, len(entries))
	at := hdr
	for i, e := range entries {
		at = (at + uint64(align) - 1) / uint64(align) * uint64(align)
		offs[i] = at
		at += uint64(len(e.Object))
	}
	out := make([]byte, 0, at)
	out = append(out, BundleMagic...)
	out = binary.LittleEndian.AppendUint64(out, uint64(len(entries)))
	for i, e := range entries {
		out = binary.LittleEndian.AppendUint64(out, offs[i])
		out = binary.LittleEndian.AppendUint64(out, uint64(len(e.Object)))
		out = binary.LittleEndian.AppendUint64(out, uint64(len(e.ID)))
		out = append(out, e.ID...)
	}
	for i, e := range entries {
		for uint64(len(out)) < offs[i] {
			out = append(out, 0)
		}
		out = append(out, e.Object...)
	}
	return out
}

// Compression choices for BuildCompressed.
const (
	// ZstdSingleSegment writes a single-segment zstd frame.
	ZstdSingleSegment = 1 << iota
)

// BuildCompressed compresses an uncompressed bundle the way
// clang-offload-bundler -compress does: a "CCOB" header of the given
// version (1, 2 or 3), method (MethodZlib or MethodZstd) and the compressed
// data. With ZstdSingleSegment in opts the zstd frame is a single-segment
// frame, whose window is its content size (what the zstd library's one-shot
// API writes for LLVM), otherwise it carries an 8 MiB window descriptor.
func BuildCompressed(bundle []byte, version, method uint16, opts int) ([]byte, error) {
	var data []byte
	switch method {
	case MethodZlib:
		var b bytes.Buffer
		w, _ := zlib.NewWriterLevel(&b, zlib.DefaultCompression)
		w.Write(bundle)
		if err := w.Close(); err != nil {
			return nil, err
		}
		data = b.Bytes()
	case MethodZstd:
		enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(8<<20),
			zstd.WithSingleSegment(opts&ZstdSingleSegment != 0))
		if err != nil {
			return nil, err
		}
		data = enc.EncodeAll(bundle, nil)
	default:
		return nil, fmt.Errorf("compression method %d", method)
	}
	hl, ok := ccobHeaderLen[version]
	if !ok {
		return nil, fmt.Errorf("compressed bundle version %d", version)
	}
	sum := md5.Sum(bundle)
	out := make([]byte, 0, hl+len(data))
	out = append(out, CompressedMagic...)
	out = binary.LittleEndian.AppendUint16(out, version)
	out = binary.LittleEndian.AppendUint16(out, method)
	total := uint64(hl + len(data))
	switch version {
	case 1:
		out = binary.LittleEndian.AppendUint32(out, uint32(len(bundle)))
	case 2:
		out = binary.LittleEndian.AppendUint32(out, uint32(total))
		out = binary.LittleEndian.AppendUint32(out, uint32(len(bundle)))
	case 3:
		out = binary.LittleEndian.AppendUint64(out, total)
		out = binary.LittleEndian.AppendUint64(out, uint64(len(bundle)))
	}
	out = append(out, sum[:8]...)
	return append(out, data...), nil
}

// BuildCodeObject writes the ELF header of an AMDGPU code object (ELF64,
// ELFOSABI_AMDGPU_HSA, ET_DYN) with the given e_ident[EI_ABIVERSION] and
// e_flags, followed by body; enough for Scan and debug/elf.
func BuildCodeObject(abiVersion uint8, flags uint32, body []byte) []byte {
	h := make([]byte, 64, 64+len(body))
	copy(h, "\x7fELF")
	h[4], h[5], h[6], h[7], h[8] = 2, 1, 1, osABIAMDGPUHSA, abiVersion
	binary.LittleEndian.PutUint16(h[16:], 3) // ET_DYN
	binary.LittleEndian.PutUint16(h[18:], EMAMDGPU)
	binary.LittleEndian.PutUint32(h[20:], 1)
	binary.LittleEndian.PutUint32(h[0x30:], flags)
	binary.LittleEndian.PutUint16(h[0x34:], 64)
	return append(h, body...)
}

// BuildELF writes a small little-endian x86-64 ELF64 shared object with a
// .text section holding text and, when fatbin is not nil, a .hip_fatbin
// section holding it (aligned to 4096, as the HIP toolchain does); the
// section header table is at the end, as linkers write it.
func BuildELF(text, fatbin []byte) []byte { return elfsect.Build(text, sectionName, fatbin, 4096) }
