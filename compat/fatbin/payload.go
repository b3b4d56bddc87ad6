package fatbin

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strconv"

	"github.com/klauspost/compress/zstd"
)

// maxPayloadRead bounds what kiln decompresses of one payload to read its
// variant: the PTX ".target" line is at the start, and a cubin records its
// ptxas options in a note among its first sections (2.6 KB into the
// cubins of llama.cpp's CUDA 13.1 build); its ELF flags are in its first
// 64 bytes.
const maxPayloadRead = 1 << 20

// variantReader reads the variant of an entry from its payload.
type variantReader struct {
	zr  *zstd.Decoder
	buf bytes.Buffer
}

// variant returns the entry's variant read from its payload (stored bytes
// of the entry, compressed as its flags say). It returns VariantUnknown when
// the payload cannot be read or names no target.
func (v *variantReader) variant(e Entry, payload io.Reader) string {
	v.buf.Reset()
	var src io.Reader
	switch {
	case e.Flags&FlagZstd != 0:
		if v.zr == nil {
			zr, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
				zstd.WithDecoderMaxMemory(64<<20), zstd.WithDecoderMaxWindow(8<<20))
			if err != nil {
				return VariantUnknown
			}
			v.zr = zr
		}
		if err := v.zr.Reset(payload); err != nil {
			return VariantUnknown
		}
		src = v.zr
	case e.Flags&FlagCompressed != 0:
		b, err := io.ReadAll(io.LimitReader(payload, maxPayloadRead))
		if err != nil {
			return VariantUnknown
		}
		// A block cut at the read limit decodes up to the cut.
		out, _ := lz4Block(b, maxPayloadRead)
		if len(out) == 0 {
			return VariantUnknown
		}
		src = bytes.NewReader(out)
	default:
		src = payload
	}
	if _, err := io.Copy(&v.buf, io.LimitReader(src, maxPayloadRead)); err != nil && v.buf.Len() == 0 {
		return VariantUnknown
	}
	b := v.buf.Bytes()
	if e.Kind == KindPTX {
		return ptxVariant(b, e.Arch)
	}
	return cubinVariant(b, e.Arch)
}

// ptxVariant reads the ".target sm_90a" line of a PTX text.
func ptxVariant(b []byte, arch int) string {
	i := bytes.Index(b, []byte(".target"))
	if i < 0 {
		return VariantUnknown
	}
	return targetVariant(b[i+len(".target"):], arch)
}

// cubinVariant reads the ptxas options a cubin records ("-arch sm_120a"),
// and failing that the ELF flags of the old layout (ABI version 7 and
// earlier: EF_CUDA_ACCELERATORS 0x800 marks sm_90a, as LLVM's ELF.h
// defines it).
func cubinVariant(b []byte, arch int) string {
	for _, opt := range [][]byte{[]byte("-arch sm_"), []byte("-arch=sm_"), []byte("--gpu-name sm_"), []byte("-arch "), []byte("-arch=")} {
		if i := bytes.Index(b, opt); i >= 0 {
			if v := targetVariant(b[i+len(opt)-len(lastWord(opt)):], arch); v != VariantUnknown {
				return v
			}
		}
	}
	if len(b) >= 52 && bytes.HasPrefix(b, []byte("\x7fELF")) && b[4] == 2 && b[8] < 8 {
		flags := binary.LittleEndian.Uint32(b[48:])
		if int(flags&0xff) == arch {
			if flags&0x800 != 0 {
				return VariantArch
			}
			return VariantPlain
		}
	}
	return VariantUnknown
}

// lastWord is what of an option prefix belongs to the target ("sm_").
func lastWord(opt []byte) []byte {
	if i := bytes.LastIndexAny(opt, " ="); i >= 0 {
		return opt[i+1:]
	}
	return opt
}

// targetVariant reads "sm_90a", "compute_100f", "sm_86" at the start of b
// (after blanks) and returns its variant when its architecture is arch.
func targetVariant(b []byte, arch int) string {
	b = bytes.TrimLeft(b, " \t")
	switch {
	case bytes.HasPrefix(b, []byte("sm_")):
		b = b[3:]
	case bytes.HasPrefix(b, []byte("compute_")):
		b = b[8:]
	default:
		return VariantUnknown
	}
	n := 0
	for n < len(b) && n < 4 && b[n] >= '0' && b[n] <= '9' {
		n++
	}
	a, err := strconv.Atoi(string(b[:n]))
	if err != nil || a != arch {
		return VariantUnknown
	}
	if n < len(b) {
		switch b[n] {
		case 'a':
			return VariantArch
		case 'f':
			return VariantFamily
		}
	}
	return VariantPlain
}

var errLZ4 = errors.New("not an LZ4 block")

// lz4Block decodes an LZ4 block (the compression of CUDA 11 and 12 fat
// binary payloads) up to limit bytes of output.
func lz4Block(src []byte, limit int) ([]byte, error) {
	var dst []byte
	for i := 0; i < len(src); {
		tok := src[i]
		i++
		lit := int(tok >> 4)
		if lit == 15 {
			for {
				if i >= len(src) {
					return dst, errLZ4
				}
				c := src[i]
				i++
				lit += int(c)
				if c != 255 {
					break
				}
			}
		}
		if lit > len(src)-i {
			return dst, errLZ4
		}
		dst = append(dst, src[i:i+lit]...)
		i += lit
		if len(dst) >= limit {
			return dst[:limit], nil
		}
		if i == len(src) {
			return dst, nil // the last sequence has literals only
		}
		if i+2 > len(src) {
			return dst, errLZ4
		}
		off := int(src[i]) | int(src[i+1])<<8
		i += 2
		if off == 0 || off > len(dst) {
			return dst, errLZ4
		}
		ml := int(tok&15) + 4
		if tok&15 == 15 {
			for {
				if i >= len(src) {
					return dst, errLZ4
				}
				c := src[i]
				i++
				ml += int(c)
				if c != 255 {
					break
				}
			}
		}
		start := len(dst) - off
		for k := 0; k < ml; k++ {
			dst = append(dst, dst[start+k])
		}
		if len(dst) >= limit {
			return dst[:limit], nil
		}
	}
	return dst, nil
}
