package fatbin

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	"kiln.dev/kiln/compat/elfsect"
)

// ErrNotELF is returned by Scan for input that is not a little-endian ELF file.
var ErrNotELF = elfsect.ErrNotELF

const bufSize = 256 << 10

var magicBytes = []byte{0x50, 0xed, 0x55, 0xba}

// ELFResult is what Scan found in one ELF file.
type ELFResult struct {
	Result
	// Section is true when the section table names a .nv_fatbin section.
	// SectionsRead is false when the section names could not be read from
	// the stream; containers are then kept on the strength of their headers.
	Section      bool `json:"section"`
	SectionsRead bool `json:"sections_read"`
}

// Scanner reads ELF files as streams; it keeps its buffer between files.
// The zero value is ready to use. A Scanner is not safe for concurrent use.
type Scanner struct {
	br *bufio.Reader
	vr variantReader
	// variants holds, per distinct entry header, the variant read from
	// the first such payload; decodes counts payloads read in this file.
	variants map[string]string
	decodes  int
}

// maxDecodes bounds the payloads read per file for their variant; past it
// an entry whose header is new takes the variant of the last entry of its
// kind and architecture (or VariantUnknown).
const maxDecodes = 512

// variantOf returns the variant of the entry at the stream's position,
// reading its payload when no entry with the same header was read before.
// It leaves the stream at most at next.
func (sc *Scanner) variantOf(s *stream, h entryHeader, next int64) string {
	if v, ok := sc.variants[h.key]; ok {
		return v
	}
	short := fmt.Sprintf("%d/%d", h.Kind, h.Arch)
	if sc.decodes >= maxDecodes {
		if v, ok := sc.variants[short]; ok {
			return v
		}
		return VariantUnknown
	}
	sc.decodes++
	if s.advance(int64(h.hdr)) != nil {
		return VariantUnknown
	}
	stored := int64(h.stored)
	if stored <= 0 || stored > next-s.pos {
		stored = next - s.pos
	}
	v := sc.vr.variant(h.Entry, io.LimitReader(s, stored))
	sc.variants[h.key] = v
	sc.variants[short] = v
	return v
}

type stream struct {
	br   *bufio.Reader
	size int // the buffer's size
	pos  int64
	tabs *elfsect.Tables
}

func (s *stream) keep(b []byte) { s.tabs.Keep(s.pos, b) }

// advance moves n bytes forward, copying what the windows want.
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
			return err
		}
	}
	return nil
}

// Read reads from the stream, keeping what the windows want.
func (s *stream) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	b, err := s.br.Peek(min(len(p), s.size))
	if len(b) == 0 {
		if err == nil {
			err = io.EOF
		}
		return 0, err
	}
	n := copy(p, b)
	if aerr := s.advance(int64(n)); aerr != nil {
		return n, aerr
	}
	return n, nil
}

// Scan reads an ELF file of size bytes (-1 when unknown) from r to its end
// and lists the code in its .nv_fatbin section. Memory use is bounded by a
// fixed buffer and the section header table (at most 4 MiB), whatever the
// file's size.
func (sc *Scanner) Scan(r io.Reader, size int64) (*ELFResult, error) {
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
	s := &stream{br: sc.br, size: sc.br.Size()}
	out := &ELFResult{}
	if sc.variants == nil {
		sc.variants = map[string]string{}
	} else {
		clear(sc.variants)
	}
	sc.decodes = 0
	peek, _ := s.br.Peek(64)
	// The buffer is overwritten as the stream moves on: keep a copy.
	hdr := append([]byte(nil), peek...)
	h, err := elfsect.ParseHeader(hdr)
	if err != nil {
		return out, err
	}
	s.tabs = elfsect.NewTables(h, size)

	type container struct {
		off int64
		res Result
	}
	var found []container
	for {
		b, err := s.br.Peek(s.size)
		if len(b) == 0 {
			break
		}
		i := bytes.Index(b, magicBytes)
		if i < 0 {
			if err != nil {
				_ = s.advance(int64(len(b)))
				break
			}
			if aerr := s.advance(int64(len(b) - len(magicBytes) + 1)); aerr != nil {
				break
			}
			continue
		}
		if aerr := s.advance(int64(i)); aerr != nil {
			break
		}
		h, _ := s.br.Peek(containerHeaderSize)
		csize, cerr := parseContainerHeader(h)
		if cerr != nil || csize > 1<<40 || (size >= 0 && uint64(s.pos)+containerHeaderSize+csize > uint64(size)) {
			if s.advance(1) != nil {
				break
			}
			continue
		}
		c := container{off: s.pos}
		c.res.Containers = 1
		end := s.pos + containerHeaderSize + int64(csize)
		if s.advance(containerHeaderSize) != nil {
			break
		}
		for s.pos+minEntryHeader <= end {
			eh, _ := s.br.Peek(int(min(maxEntryHeader, end-s.pos, int64(s.size))))
			h, perr := parseEntryHeader(eh)
			if perr != nil || h.payload > uint64(end-s.pos) {
				break
			}
			next := s.pos + int64(h.hdr) + int64(h.payload)
			if next <= s.pos || next > end {
				break
			}
			if h.Arch >= firstVariantArc && (h.Kind == KindPTX || h.Kind == KindELF) {
				h.Variant = sc.variantOf(s, h, next)
			}
			c.res.add(h.Entry)
			if s.advance(next-s.pos) != nil {
				break
			}
		}
		found = append(found, c)
		if s.pos < end && s.advance(end-s.pos) != nil {
			break
		}
	}

	// Keep the containers that lie in a .nv_fatbin section, when the
	// section table could be read.
	ranges, read := s.tabs.Sections(".nv_fatbin")
	out.SectionsRead = read
	for _, c := range found {
		if _, in := elfsect.Find(ranges, c.off); read && !in {
			continue
		}
		out.Merge(&c.res)
	}
	out.Section = len(ranges) > 0
	return out, nil
}
