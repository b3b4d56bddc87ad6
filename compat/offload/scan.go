package offload

import (
	"bufio"
	"bytes"
	"errors"
	"io"

	"kiln.dev/kiln/compat/elfsect"
)

// ErrNotELF is returned by Scan for input that is neither a little-endian
// ELF file nor a bare offload bundle.
var ErrNotELF = elfsect.ErrNotELF

const (
	bufSize = 256 << 10
	// maxCandidates bounds the bundles one scan records.
	maxCandidates = 1 << 16
	// decodeInput is how much compressed data is handed to a decoder.
	decodeInput = 192 << 10
	// sectionName is where HIP binaries keep their bundles.
	sectionName = ".hip_fatbin"
)

// Scanner reads files as streams; it keeps its buffers and decompressors
// between files. The zero value is ready to use. A Scanner is not safe for
// concurrent use.
type Scanner struct {
	br      *bufio.Reader
	dec     decoders
	scratch [maxIDLen]byte
}

type stream struct {
	br   *bufio.Reader
	size int // the buffer's size
	pos  int64
	tabs *elfsect.Tables
	err  error // the first read error other than io.EOF
}

func (s *stream) keep(b []byte) { s.tabs.Keep(s.pos, b) }

func (s *stream) noteErr(err error) {
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, bufio.ErrBufferFull) && s.err == nil {
		s.err = err
	}
}

// advance moves n bytes forward, copying what the windows want. It returns
// an error when the stream ends first.
func (s *stream) advance(n int64) error {
	for n > 0 {
		chunk := int(min(n, int64(s.size)))
		b, err := s.br.Peek(chunk)
		if len(b) > 0 {
			s.keep(b)
			d, _ := s.br.Discard(len(b))
			s.pos += int64(d)
			n -= int64(d)
		}
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			s.noteErr(err)
			if n > 0 {
				return err
			}
		}
	}
	return nil
}

// drain reads the stream to its end.
func (s *stream) drain() {
	for s.advance(int64(s.size)) == nil {
	}
}

// Read consumes bytes through the windows.
func (s *stream) Read(p []byte) (int, error) {
	n, err := s.br.Read(p)
	if n > 0 {
		s.keep(p[:n])
		s.pos += int64(n)
	}
	s.noteErr(err)
	return n, err
}

// finder finds the next occurrence of a pattern without searching a byte
// twice: it remembers the next match and how far the stream is known to
// hold none.
type finder struct {
	pat   []byte
	at    int64 // the next match, when at >= the stream's position
	clear int64 // no match starts in [pos, clear) except at
}

func (f *finder) reset() { f.at, f.clear = -1, 0 }

// next returns the index in b, which holds the stream from pos, of the next
// match, or -1.
func (f *finder) next(b []byte, pos int64, eof bool) int {
	if f.at >= pos {
		if f.at+int64(len(f.pat)) <= pos+int64(len(b)) {
			return int(f.at - pos)
		}
		return -1
	}
	start := max(f.clear, pos) - pos
	if start < int64(len(b)) {
		if j := bytes.Index(b[start:], f.pat); j >= 0 {
			f.at = pos + start + int64(j)
			f.clear = f.at
			return int(f.at - pos)
		}
	}
	if eof {
		f.clear = pos + int64(len(b))
	} else {
		f.clear = max(f.clear, pos+int64(len(b)-len(f.pat)+1))
	}
	return -1
}

// candidate is one bundle found in the stream.
type candidate struct {
	off        int64
	end        int64 // where the bundle ends, when known
	targets    []Target
	compressed bool
	unreadable bool
	// weak candidates are bundle-shaped but unreadable; they count only
	// when they lie in a .hip_fatbin section.
	weak bool
}

// Scan reads a file of size bytes (-1 when unknown) from r to its end and
// lists the AMD GPU targets in it: those of the offload bundles in its
// .hip_fatbin section, or the file's own when it is an AMDGPU code object.
// Memory use is bounded by fixed buffers, the section header table (at most
// 4 MiB) and a 2 MiB decompression window, whatever the file's size.
//
// When the section table cannot be read from the stream, bundles are kept
// anywhere in the file on the strength of their headers. A file that is a
// bare bundle (a .hipfb file) is read too. For other input Scan returns
// ErrNotELF at once.
func (sc *Scanner) Scan(r io.Reader, size int64) (*Result, error) {
	// Small files get a small buffer; the buffer grows once for a big one.
	need := bufSize
	if size >= 0 && size < bufSize {
		need = max(int(size), 4096)
	}
	if sc.br == nil || sc.br.Size() < need {
		sc.br = bufio.NewReaderSize(r, need)
	} else {
		sc.br.Reset(r)
	}
	sc.dec.decodes, sc.dec.decoded = 0, 0
	s := &stream{br: sc.br, size: sc.br.Size()}
	out := &Result{}
	peek, err := s.br.Peek(64)
	s.noteErr(err)
	// The buffer is overwritten as the stream moves on: keep a copy.
	hdr := append([]byte(nil), peek...)

	bare := bytes.HasPrefix(hdr, []byte(BundleMagic)) || bytes.HasPrefix(hdr, []byte(CompressedMagic))
	if !bare {
		h, herr := elfsect.ParseHeader(hdr)
		if herr != nil {
			if s.err != nil {
				return out, s.err
			}
			return out, ErrNotELF
		}
		if h.Machine == EMAMDGPU {
			// The file is a code object: its header says it all.
			t, _ := TargetFromFlags(h.Class(), h.OSABI, h.ABIVersion, h.Flags)
			out.CodeObject = true
			out.addTarget(t)
			s.drain()
			return out, s.err
		}
		s.tabs = elfsect.NewTables(h, size)
	}

	found := sc.find(s, size)
	s.drain()

	// Keep the bundles that lie in a .hip_fatbin section, when the section
	// table could be read.
	ranges, sectionsRead := s.tabs.Sections(sectionName)
	total := s.pos
	for _, c := range found {
		limit := total
		if sectionsRead {
			r, in := elfsect.Find(ranges, c.off)
			if !in {
				continue
			}
			limit = min(total, r[1])
		} else if c.weak {
			continue
		}
		// A bundle that runs past the end of the file, or of its section,
		// was cut short.
		if c.unreadable || c.end > limit {
			out.Unreadable++
			continue
		}
		out.Bundles++
		if c.compressed {
			out.Compressed++
		}
		for _, t := range c.targets {
			out.addTarget(t)
		}
	}
	return out, s.err
}

// find reads the stream to its end, or until it fails, and returns the
// bundles it holds.
func (sc *Scanner) find(s *stream, size int64) []candidate {
	fb := finder{pat: []byte(BundleMagic)}
	fc := finder{pat: []byte(CompressedMagic)}
	fb.reset()
	fc.reset()
	var found []candidate
	record := func(c candidate) {
		if len(found) < maxCandidates {
			found = append(found, c)
		}
	}
	for {
		// Peek the whole buffer only when less than half of it is
		// buffered: each refill moves what is buffered to the front.
		var b []byte
		var err error
		if n := s.br.Buffered(); n >= s.size/2 {
			b, _ = s.br.Peek(n)
		} else {
			b, err = s.br.Peek(s.size)
			s.noteErr(err)
		}
		if len(b) == 0 {
			return found
		}
		eof := err != nil
		i, compressed := fb.next(b, s.pos, eof), false
		if j := fc.next(b, s.pos, eof); j >= 0 && (i < 0 || j < i) {
			i, compressed = j, true
		}
		if i < 0 {
			if eof {
				_ = s.advance(int64(len(b)))
				return found
			}
			// Keep a magic's length less one: a match may straddle.
			if s.advance(int64(max(len(b)-len(BundleMagic)+1, 1))) != nil {
				return found
			}
			continue
		}
		if s.advance(int64(i)) != nil {
			return found
		}
		var took bool
		if compressed {
			took = sc.readCompressed(s, size, record)
		} else {
			took = sc.readBundle(s, record)
		}
		if !took && s.advance(1) != nil {
			return found
		}
		if s.err != nil {
			return found
		}
	}
}

// readBundle reads the uncompressed bundle at the stream's position. It
// returns false, having consumed nothing, when the bytes there are not a
// bundle.
func (sc *Scanner) readBundle(s *stream, record func(candidate)) bool {
	req := min(s.size, bundleFixed+entryFixed+maxIDLen)
	b, _ := s.br.Peek(req)
	plausible, need := checkBundleStart(b)
	if !plausible {
		if need && len(b) < req {
			// The file ends inside what would be a bundle header.
			record(candidate{off: s.pos, unreadable: true, weak: true})
		}
		return false
	}
	c := candidate{off: s.pos}
	ents, hdr, err := readBundleHeader(s, sc.scratch[:])
	if err == nil {
		var end uint64
		c.targets, end, err = bundleTargets(ents, hdr)
		c.end = c.off + int64(end)
	}
	if err != nil {
		c.unreadable = true
	}
	record(c)
	return true
}

// readCompressed reads the compressed bundle at the stream's position. It
// returns false, having consumed nothing, when the bytes there are not a
// compressed bundle.
func (sc *Scanner) readCompressed(s *stream, size int64, record func(candidate)) bool {
	const probe = 40 // the longest header and the start of the data
	b, _ := s.br.Peek(probe)
	h, check := parseCCOB(b)
	c := candidate{off: s.pos, compressed: true}
	switch check {
	case ccobNo:
		return false
	case ccobTruncated:
		if len(b) < probe {
			c.unreadable, c.weak = true, true
			record(c)
		}
		return false
	case ccobUnknown:
		// A version or method kiln cannot read: count it, and scan on
		// from just after the magic.
		c.unreadable, c.weak = true, true
		record(c)
		return false
	}
	if !dataLooksCompressed(h.method, b[h.hdrLen:]) {
		// Bundle-shaped, but no compressed stream follows.
		c.unreadable, c.weak = true, true
		record(c)
		return false
	}
	// Enough of the compressed data for the bundle header: it is in the
	// first zstd block (at most 128 KiB) or deflate blocks. Peeking more
	// than is buffered moves the buffer, so ask for no more than needed.
	want := min(s.size, decodeInput)
	if h.total > 0 {
		want = int(min(int64(want), int64(h.total)))
	}
	b, _ = s.br.Peek(max(want, min(s.br.Buffered(), s.size)))
	data := b[h.hdrLen:]
	if h.total > 0 {
		c.end = c.off + int64(h.total)
		if size >= 0 && c.end > size {
			c.unreadable = true
		}
		if rest := h.total - uint64(h.hdrLen); uint64(len(data)) > rest {
			data = data[:rest]
		}
	}
	if !c.unreadable {
		if sc.dec.spent() {
			c.unreadable = true
		} else {
			ts, err := sc.dec.readCompressed(h, data, sc.scratch[:])
			c.targets = ts
			c.unreadable = err != nil
		}
	}
	record(c)
	// Skip the compressed data when its size is known: it may hold the
	// magics by chance. Version 1 does not record it: scan on after the
	// header.
	skip := int64(h.hdrLen)
	if h.total > 0 {
		skip = int64(h.total)
	}
	_ = s.advance(skip)
	return true
}
