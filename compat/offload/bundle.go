package offload

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// Magics.
const (
	BundleMagic     = "__CLANG_OFFLOAD_BUNDLE__"
	CompressedMagic = "CCOB"
)

// Compression methods of compressed bundles (llvm::compression::Format).
const (
	MethodZlib = 0
	MethodZstd = 1
)

const (
	// maxEntries and maxIDLen bound what kiln takes for a bundle header;
	// real bundles have a few dozen entries with ids of under 100 bytes.
	maxEntries = 4096
	maxIDLen   = 1024
	// maxOffset bounds entry offsets and sizes and bundle sizes (1 TiB).
	maxOffset = 1 << 40
	// maxDecompressed bounds what is decompressed of one compressed bundle:
	// its header is at the start.
	maxDecompressed = 1 << 20
	// zstdWindow is the window kiln decodes zstd frames with: the frame
	// header is rewritten to it (see zstdFrame), so that memory does not
	// follow the window the compressor chose. Matches cannot reach back
	// further than what was decoded, which stays under maxDecompressed plus
	// a block.
	zstdWindowLog = 21
	zstdWindow    = 1 << zstdWindowLog
	// maxDecodes bounds how many compressed bundles one scan decompresses,
	// and maxDecodedTotal what it reads from them all: real bundle headers
	// take a few KiB each.
	maxDecodes      = 1 << 16
	maxDecodedTotal = 256 << 20

	bundleFixed = len(BundleMagic) + 8 // magic and entry count
	entryFixed  = 24                   // offset, size, id length
)

// ccobHeaderLen is the header size of each compressed bundle version.
var ccobHeaderLen = map[uint16]int{1: 20, 2: 24, 3: 32}

var (
	errNotBundle = errors.New("not an offload bundle")
	errTruncated = errors.New("truncated offload bundle")
)

// entry is one bundle entry.
type entry struct {
	off, size uint64
	id        string
}

// parseEntryID reads a bundle entry id. ok is false when id does not follow
// the "<kind>-<triple>[-<target id>]" syntax; gpu is true when it names an
// amdgcn processor, whose target is t.
func parseEntryID(id string) (t Target, gpu, ok bool) {
	kind, rest, found := strings.Cut(id, "-")
	if !found || !isWord(kind) || isArch(kind) {
		return Target{}, false, false
	}
	triple, tid, err := splitTriple(rest)
	if err != nil {
		return Target{}, false, false
	}
	arch, _, _ := strings.Cut(triple, "-")
	if kind == KindHost || arch != "amdgcn" || tid == "" {
		return Target{}, false, true
	}
	proc, feats, err := parseTargetID(tid)
	if err != nil {
		return Target{}, false, false
	}
	return Target{Kind: kind, Triple: triple, Processor: proc, Features: feats}, true, true
}

func printable(b []byte) bool {
	for _, c := range b {
		if c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// checkBundleStart checks the start of an uncompressed bundle held in b:
// the magic, a plausible entry count and a first entry whose id parses.
// need is true when b ends before that could be decided.
func checkBundleStart(b []byte) (plausible, need bool) {
	if len(b) < bundleFixed {
		return false, true
	}
	n := binary.LittleEndian.Uint64(b[len(BundleMagic):])
	if n == 0 || n > maxEntries {
		return false, false
	}
	if len(b) < bundleFixed+entryFixed {
		return false, true
	}
	e := b[bundleFixed:]
	idLen := binary.LittleEndian.Uint64(e[16:])
	if idLen == 0 || idLen > maxIDLen || binary.LittleEndian.Uint64(e) > maxOffset || binary.LittleEndian.Uint64(e[8:]) > maxOffset {
		return false, false
	}
	if uint64(len(e)) < entryFixed+idLen {
		return false, true
	}
	id := e[entryFixed : entryFixed+idLen]
	if !printable(id) {
		return false, false
	}
	_, _, ok := parseEntryID(string(id))
	return ok, false
}

// readBundleHeader reads an uncompressed bundle header from r, which is at
// the magic. It returns the entries and the header's length. Errors are
// errNotBundle for a header that is not plausible and errTruncated when r
// ends inside it.
func readBundleHeader(r io.Reader, scratch []byte) ([]entry, uint64, error) {
	var fixed [bundleFixed]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return nil, 0, errTruncated
	}
	if string(fixed[:len(BundleMagic)]) != BundleMagic {
		return nil, 0, errNotBundle
	}
	n := binary.LittleEndian.Uint64(fixed[len(BundleMagic):])
	if n == 0 || n > maxEntries {
		return nil, 0, fmt.Errorf("%w: %d entries", errNotBundle, n)
	}
	hdr := uint64(bundleFixed)
	ents := make([]entry, 0, min(n, 64))
	for range n {
		var eh [entryFixed]byte
		if _, err := io.ReadFull(r, eh[:]); err != nil {
			return ents, hdr, errTruncated
		}
		e := entry{off: binary.LittleEndian.Uint64(eh[0:]), size: binary.LittleEndian.Uint64(eh[8:])}
		idLen := binary.LittleEndian.Uint64(eh[16:])
		if idLen == 0 || idLen > maxIDLen || e.off > maxOffset || e.size > maxOffset {
			return ents, hdr, fmt.Errorf("%w: entry %d: offset %d size %d id length %d", errNotBundle, len(ents), e.off, e.size, idLen)
		}
		id := scratch[:idLen]
		if _, err := io.ReadFull(r, id); err != nil {
			return ents, hdr, errTruncated
		}
		if !printable(id) {
			return ents, hdr, fmt.Errorf("%w: entry %d: id is not printable", errNotBundle, len(ents))
		}
		e.id = string(id)
		hdr += entryFixed + idLen
		ents = append(ents, e)
	}
	return ents, hdr, nil
}

// bundleTargets turns a bundle's entries into its targets and the bundle's
// size (the end of its last code object). It checks that the entries are
// plausible: ids follow the syntax and code objects lie after the header.
func bundleTargets(ents []entry, hdr uint64) ([]Target, uint64, error) {
	var ts []Target
	end := hdr
	for i, e := range ents {
		t, gpu, ok := parseEntryID(e.id)
		if !ok {
			return nil, 0, fmt.Errorf("%w: entry %d: id %q is not a bundle entry id", errNotBundle, i, e.id)
		}
		if e.size > 0 {
			if e.off < hdr {
				return nil, 0, fmt.Errorf("%w: entry %d: code object at %d overlaps the %d-byte header", errNotBundle, i, e.off, hdr)
			}
			end = max(end, e.off+e.size)
		}
		if gpu {
			ts = append(ts, t)
		}
	}
	return ts, end, nil
}

// ccobHeader is a compressed bundle header.
type ccobHeader struct {
	version, method uint16
	hdrLen          int
	total           uint64 // 0 for version 1, which does not record it
	uncompressed    uint64
}

// ccobCheck is what parseCCOB made of a header.
type ccobCheck int

const (
	ccobNo        ccobCheck = iota // not a compressed bundle
	ccobTruncated                  // the input ends inside the header
	ccobUnknown                    // plausible, but a version or method kiln cannot read
	ccobOK
)

// parseCCOB reads a compressed bundle header from b, which starts at the
// magic.
func parseCCOB(b []byte) (ccobHeader, ccobCheck) {
	var h ccobHeader
	if len(b) < 8 {
		return h, ccobTruncated
	}
	if string(b[:4]) != CompressedMagic {
		return h, ccobNo
	}
	h.version = binary.LittleEndian.Uint16(b[4:])
	h.method = binary.LittleEndian.Uint16(b[6:])
	if h.version == 0 || h.version > 15 || h.method > 15 {
		return h, ccobNo
	}
	hl, known := ccobHeaderLen[h.version]
	if !known || (h.method != MethodZlib && h.method != MethodZstd) {
		return h, ccobUnknown
	}
	h.hdrLen = hl
	if len(b) < hl {
		return h, ccobTruncated
	}
	switch h.version {
	case 1:
		h.uncompressed = uint64(binary.LittleEndian.Uint32(b[8:]))
	case 2:
		h.total = uint64(binary.LittleEndian.Uint32(b[8:]))
		h.uncompressed = uint64(binary.LittleEndian.Uint32(b[12:]))
	case 3:
		h.total = binary.LittleEndian.Uint64(b[8:])
		h.uncompressed = binary.LittleEndian.Uint64(b[16:])
	}
	if h.uncompressed < uint64(bundleFixed) || h.uncompressed > maxOffset {
		return h, ccobNo
	}
	if h.version >= 2 && (h.total <= uint64(hl) || h.total > maxOffset) {
		return h, ccobNo
	}
	return h, ccobOK
}

// dataLooksCompressed checks the first bytes of compressed data: a zstd
// frame magic, or a zlib header with the deflate method and a valid check.
func dataLooksCompressed(method uint16, d []byte) bool {
	switch method {
	case MethodZstd:
		return len(d) >= 4 && binary.LittleEndian.Uint32(d) == 0xFD2FB528
	case MethodZlib:
		return len(d) >= 2 && d[0]&0x0f == 8 && d[0]>>4 <= 7 && (uint16(d[0])<<8|uint16(d[1]))%31 == 0
	}
	return false
}

// zstdFrame rewrites the header of the zstd frame at the start of d so that
// it declares a zstdWindow window, no content size and no dictionary, and
// returns the new header and the rest of the frame (its blocks). The
// blocks decode the same: a match cannot reach back further than what was
// decoded so far, and kiln stops long before zstdWindow. Frames that need a
// dictionary are refused.
func zstdFrame(d []byte) (hdr [6]byte, blocks []byte, err error) {
	if len(d) < 6 || binary.LittleEndian.Uint32(d) != 0xFD2FB528 {
		return hdr, nil, errors.New("not a zstd frame")
	}
	fhd := d[4]
	if fhd&0x08 != 0 {
		return hdr, nil, errors.New("zstd frame header: reserved bit set")
	}
	single := fhd&0x20 != 0
	p := 5
	if !single {
		p++ // window descriptor
	}
	dictLen := [4]int{0, 1, 2, 4}[fhd&3]
	if dictLen > 0 {
		if len(d) < p+dictLen {
			return hdr, nil, errTruncated
		}
		var id uint32
		for i := range dictLen {
			id |= uint32(d[p+i]) << (8 * i)
		}
		if id != 0 {
			return hdr, nil, errors.New("zstd frame needs a dictionary")
		}
	}
	p += dictLen
	fcsLen := [4]int{0, 2, 4, 8}[fhd>>6]
	if fcsLen == 0 && single {
		fcsLen = 1
	}
	p += fcsLen
	if len(d) < p {
		return hdr, nil, errTruncated
	}
	binary.LittleEndian.PutUint32(hdr[:], 0xFD2FB528)
	hdr[4] = fhd & 0x04 // keep the checksum flag: the content is the same
	// Window descriptor: exponent = log2(window) - 10, mantissa 0.
	hdr[5] = byte(zstdWindowLog-10) << 3
	return hdr, d[p:], nil
}

// decoders holds the decompressors a Scanner reuses.
type decoders struct {
	zstd *zstd.Decoder
	zlib io.ReadCloser
	// decodes counts the bundles decompressed in this scan, decoded the
	// bytes read from them.
	decodes int
	decoded int64
}

// spent reports whether this scan has decompressed all it may.
func (dc *decoders) spent() bool { return dc.decodes >= maxDecodes || dc.decoded >= maxDecodedTotal }

// open returns a reader of the uncompressed data of the compressed bundle
// whose data (the bytes after its header) start with d.
func (dc *decoders) open(method uint16, d []byte) (io.Reader, error) {
	switch method {
	case MethodZstd:
		hdr, blocks, err := zstdFrame(d)
		if err != nil {
			return nil, err
		}
		src := io.MultiReader(bytes.NewReader(hdr[:]), bytes.NewReader(blocks))
		if dc.zstd == nil {
			dc.zstd, err = zstd.NewReader(nil,
				zstd.WithDecoderConcurrency(1),
				zstd.WithDecoderLowmem(true),
				zstd.WithDecoderMaxWindow(zstdWindow),
				zstd.WithDecoderMaxMemory(zstdWindow))
			if err != nil {
				return nil, err
			}
		}
		if err := dc.zstd.Reset(src); err != nil {
			return nil, err
		}
		return dc.zstd, nil
	case MethodZlib:
		src := bytes.NewReader(d)
		if dc.zlib == nil {
			zr, err := zlib.NewReader(src)
			if err != nil {
				return nil, err
			}
			dc.zlib = zr
			return zr, nil
		}
		if err := dc.zlib.(zlib.Resetter).Reset(src, nil); err != nil {
			return nil, err
		}
		return dc.zlib, nil
	}
	return nil, fmt.Errorf("compression method %d", method)
}

// readCompressed decodes the header of the compressed bundle whose header
// is h and whose compressed data start with d, and returns its targets.
func (dc *decoders) readCompressed(h ccobHeader, d []byte, scratch []byte) ([]Target, error) {
	r, err := dc.open(h.method, d)
	if err != nil {
		return nil, err
	}
	dc.decodes++
	lr := &io.LimitedReader{R: r, N: min(maxDecompressed, maxDecodedTotal-dc.decoded)}
	n := lr.N
	ents, hdr, err := readBundleHeader(lr, scratch)
	dc.decoded += n - lr.N
	if err != nil {
		return nil, err
	}
	ts, end, err := bundleTargets(ents, hdr)
	if err != nil {
		return nil, err
	}
	if end > h.uncompressed {
		return nil, fmt.Errorf("%w: code objects end at %d, past the %d uncompressed bytes", errNotBundle, end, h.uncompressed)
	}
	return ts, nil
}
