// Package fatbin lists the GPU code compiled into CUDA binaries: the SASS
// targets (sm_80, sm_90 ...) and PTX versions held in the fat binaries of an
// ELF file's .nv_fatbin section.
//
// A fat binary is a sequence of containers. A container has a 16-byte
// header (magic 0xBA55ED50, version 1, header size 16, then the size of what
// follows) and a run of entries; each entry has its own header (kind: 1 PTX,
// 2 ELF cubin; its header size; the padded payload size; the target
// architecture at offset 28) followed by the payload. kiln reads the headers
// and skips the payloads, so a 1 GB library is read as a stream with a small
// fixed buffer.
package fatbin

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
)

// Magic opens every fat binary container (little endian).
const Magic = 0xBA55ED50

// Entry kinds.
const (
	KindPTX  = 1
	KindELF  = 2
	KindELF2 = 0x10 // a second cubin kind some toolkits write
)

const (
	containerHeaderSize = 16
	// minEntryHeader is the shortest entry header kiln reads (up to the
	// architecture field); real ones are 64, 80 or 112 bytes.
	minEntryHeader = 32
	maxEntryHeader = 4096
)

// Entry is one code object in a container.
type Entry struct {
	// Kind is KindPTX or KindELF (KindELF2 is reported as KindELF).
	Kind int
	// Arch is the target as a number: 80 for sm_80 / compute_80.
	Arch int
}

// Result is what one binary holds.
type Result struct {
	// SASS are the architectures with compiled machine code, ascending (80, 86).
	SASS []int `json:"sass,omitempty"`
	// PTX are the architectures whose PTX is embedded, ascending.
	PTX []int `json:"ptx,omitempty"`
	// Containers and Entries count what was read.
	Containers int `json:"containers"`
	Entries    int `json:"entries"`
}

// Empty reports whether no GPU code was found.
func (r *Result) Empty() bool { return r == nil || len(r.SASS) == 0 && len(r.PTX) == 0 }

// add records an entry.
func (r *Result) add(e Entry) {
	r.Entries++
	if e.Arch <= 0 {
		return
	}
	switch e.Kind {
	case KindPTX:
		r.PTX = insertSorted(r.PTX, e.Arch)
	case KindELF, KindELF2:
		r.SASS = insertSorted(r.SASS, e.Arch)
	}
}

func insertSorted(s []int, v int) []int {
	i := sort.SearchInts(s, v)
	if i < len(s) && s[i] == v {
		return s
	}
	s = append(s, 0)
	copy(s[i+1:], s[i:])
	s[i] = v
	return s
}

// Merge adds what another binary holds.
func (r *Result) Merge(o *Result) {
	if o == nil {
		return
	}
	for _, a := range o.SASS {
		r.SASS = insertSorted(r.SASS, a)
	}
	for _, a := range o.PTX {
		r.PTX = insertSorted(r.PTX, a)
	}
	r.Containers += o.Containers
	r.Entries += o.Entries
}

// ArchName writes an architecture number the way nvcc names it: 80 ->
// "sm_80", and for PTX "compute_80".
func ArchName(arch int, ptx bool) string {
	if ptx {
		return fmt.Sprintf("compute_%d", arch)
	}
	return fmt.Sprintf("sm_%d", arch)
}

// CC writes an architecture number as a compute capability: 86 -> "8.6",
// 100 -> "10.0", 120 -> "12.0".
func CC(arch int) string { return fmt.Sprintf("%d.%d", arch/10, arch%10) }

var errNotContainer = errors.New("not a fat binary container")

// parseContainerHeader checks a container header and returns the size of
// the entries that follow it.
func parseContainerHeader(b []byte) (uint64, error) {
	if len(b) < containerHeaderSize {
		return 0, errNotContainer
	}
	if binary.LittleEndian.Uint32(b) != Magic ||
		binary.LittleEndian.Uint16(b[4:]) != 1 ||
		binary.LittleEndian.Uint16(b[6:]) != containerHeaderSize {
		return 0, errNotContainer
	}
	return binary.LittleEndian.Uint64(b[8:]), nil
}

// parseEntryHeader reads an entry header: its kind, architecture, the size
// of the header itself and of the padded payload after it.
func parseEntryHeader(b []byte) (e Entry, hdr uint32, payload uint64, err error) {
	if len(b) < minEntryHeader {
		return Entry{}, 0, 0, fmt.Errorf("fat binary entry: %d bytes is shorter than an entry header", len(b))
	}
	kind := int(binary.LittleEndian.Uint16(b))
	hdr = binary.LittleEndian.Uint32(b[4:])
	payload = binary.LittleEndian.Uint64(b[8:])
	arch := binary.LittleEndian.Uint32(b[28:])
	if hdr < minEntryHeader || hdr > maxEntryHeader {
		return Entry{}, 0, 0, fmt.Errorf("fat binary entry: header size %d is not plausible", hdr)
	}
	if kind != KindPTX && kind != KindELF && kind != KindELF2 {
		// Other kinds exist (0x40); they are skipped, not an error.
		return Entry{Kind: kind}, hdr, payload, nil
	}
	if arch > 10000 {
		return Entry{}, 0, 0, fmt.Errorf("fat binary entry: architecture %d is not plausible", arch)
	}
	if kind == KindELF2 {
		kind = KindELF
	}
	return Entry{Kind: kind, Arch: int(arch)}, hdr, payload, nil
}

// ParseSection reads the containers of a whole .nv_fatbin section held in
// memory. It stops at the first bytes that are not a container and says so.
func ParseSection(b []byte) (*Result, error) {
	r := &Result{}
	off := uint64(0)
	n := uint64(len(b))
	for off < n {
		size, err := parseContainerHeader(b[off:])
		if err != nil {
			// Sections are padded with zeros between and after containers.
			if b[off] == 0 {
				off++
				continue
			}
			return r, fmt.Errorf(".nv_fatbin at offset %d: %w", off, err)
		}
		r.Containers++
		start := off + containerHeaderSize
		if size > n-start {
			return r, fmt.Errorf(".nv_fatbin at offset %d: container of %d bytes runs past the section's end", off, size)
		}
		end := start + size
		for p := start; p+minEntryHeader <= end; {
			e, hdr, payload, err := parseEntryHeader(b[p:end])
			if err != nil {
				return r, fmt.Errorf(".nv_fatbin at offset %d: %w", p, err)
			}
			r.add(e)
			next := p + uint64(hdr) + payload
			if next <= p || next > end {
				break
			}
			p = next
		}
		off = end
	}
	return r, nil
}
