package serving

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"kiln.dev/kiln/plan"
	"kiln.dev/kiln/textsafe"
)

// GGUF is what kiln reads of a GGUF file's header: the model's shape from
// its metadata, enough to size its KV cache.
type GGUF struct {
	Version      uint32
	Tensors      uint64
	Architecture string
	Name         string
	// Shape, from the keys "<architecture>.block_count" and the like; zero
	// where the file does not say.
	Layers, Hidden, Heads, KVHeads, KeyLength, FFN, Context, Experts int
	// FileType is general.file_type (the quantisation; 15 is Q4_K_M).
	FileType int
}

// Bounds on what the GGUF reader accepts: a header is outside data.
const (
	ggufMaxKeys      = 1 << 16
	ggufMaxKeyBytes  = 1 << 16
	ggufMaxString    = 1 << 24
	ggufMaxArray     = 1 << 24
	ggufMaxMetaBytes = 256 << 20
	ggufMaxDepth     = 4
)

var errGGUFNotGGUF = errors.New("not a GGUF file (no GGUF magic)")

// ReadGGUF reads a GGUF header (versions 2 and 3) from r; it reads the
// metadata only, never the tensors, and at most 256 MiB of it (the
// tokenizer's vocabulary is most of it).
func ReadGGUF(r io.Reader) (*GGUF, error) {
	br := &ggufReader{r: bufio.NewReaderSize(io.LimitReader(r, ggufMaxMetaBytes), 64<<10)}
	var magic [4]byte
	if _, err := io.ReadFull(br.r, magic[:]); err != nil {
		return nil, fmt.Errorf("gguf: %w", errGGUFNotGGUF)
	}
	if string(magic[:]) != "GGUF" {
		return nil, fmt.Errorf("gguf: %w", errGGUFNotGGUF)
	}
	g := &GGUF{Version: br.u32()}
	if br.err == nil && g.Version != 2 && g.Version != 3 {
		return nil, fmt.Errorf("gguf: version %d; kiln reads versions 2 and 3", g.Version)
	}
	g.Tensors = br.u64()
	n := br.u64()
	if br.err != nil {
		return nil, fmt.Errorf("gguf: header: %w", br.err)
	}
	if n > ggufMaxKeys {
		return nil, fmt.Errorf("gguf: %d metadata keys, above %d", n, ggufMaxKeys)
	}
	ints := map[string]int{}
	strs := map[string]string{}
	for i := uint64(0); i < n; i++ {
		key := br.str(ggufMaxKeyBytes)
		typ := br.u32()
		if br.err != nil {
			return nil, fmt.Errorf("gguf: metadata key %d: %w", i, br.err)
		}
		v, s, err := br.value(typ, 0)
		if err != nil {
			return nil, fmt.Errorf("gguf: metadata %s: %w", textsafe.Printable(truncate(key, 80)), err)
		}
		if s != nil {
			strs[key] = *s
		} else if v != nil {
			ints[key] = *v
		}
	}
	// Both are printed (errors, the deployment's name): escaped here, once.
	g.Architecture = textsafe.Printable(truncate(strs["general.architecture"], 64))
	g.Name = textsafe.Printable(truncate(strs["general.name"], 256))
	g.FileType = ints["general.file_type"]
	a := g.Architecture + "."
	g.Layers, g.Hidden, g.FFN, g.Context = ints[a+"block_count"], ints[a+"embedding_length"], ints[a+"feed_forward_length"], ints[a+"context_length"]
	g.Heads, g.KVHeads, g.KeyLength = ints[a+"attention.head_count"], ints[a+"attention.head_count_kv"], ints[a+"attention.key_length"]
	g.Experts = ints[a+"expert_count"]
	return g, nil
}

// Model is the GGUF's shape as plan describes models; an error says what
// the header lacks to size its KV cache.
func (g *GGUF) Model() (plan.Model, error) {
	var missing []string
	for _, f := range []struct {
		v    int
		name string
	}{{g.Layers, "block_count"}, {g.Hidden, "embedding_length"}, {g.Heads, "attention.head_count"}, {g.Context, "context_length"}} {
		if f.v <= 0 {
			missing = append(missing, g.Architecture+"."+f.name)
		}
	}
	if g.Architecture == "" {
		missing = append([]string{"general.architecture"}, missing...)
	}
	if len(missing) > 0 {
		return plan.Model{}, fmt.Errorf("the GGUF header lacks %s, so kiln cannot size its KV cache", strings.Join(missing, ", "))
	}
	name := g.Name
	if name == "" {
		name = g.Architecture
	}
	return plan.Model{Name: name, Layers: g.Layers, Hidden: g.Hidden, Heads: g.Heads, KVHeads: g.KVHeads, HeadDim: g.KeyLength,
		FFN: g.FFN, Seq: g.Context, Experts: g.Experts, Source: "GGUF header"}, nil
}

// ggufReader reads little-endian values, keeping the first error.
type ggufReader struct {
	r   *bufio.Reader
	err error
	buf [8]byte
}

func (b *ggufReader) read(n int) []byte {
	if b.err != nil {
		return nil
	}
	if _, err := io.ReadFull(b.r, b.buf[:n]); err != nil {
		b.err = fmt.Errorf("the header ends early (truncated file?): %w", err)
		return nil
	}
	return b.buf[:n]
}

func (b *ggufReader) u32() uint32 {
	if p := b.read(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (b *ggufReader) u64() uint64 {
	if p := b.read(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

func (b *ggufReader) str(limit uint64) string {
	n := b.u64()
	if b.err != nil {
		return ""
	}
	if n > limit {
		b.err = fmt.Errorf("a string of %d bytes, above %d", n, limit)
		return ""
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(b.r, p); err != nil {
		b.err = fmt.Errorf("the header ends early (truncated file?): %w", err)
		return ""
	}
	return string(p)
}

func (b *ggufReader) skip(n uint64) {
	if b.err != nil {
		return
	}
	if _, err := b.r.Discard(int(n)); err != nil {
		b.err = fmt.Errorf("the header ends early (truncated file?): %w", err)
	}
}

// Sizes of GGUF's fixed-size value types, by type number.
var ggufSizes = map[uint32]uint64{0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

// value reads one value of type typ: an integer (as int, when it fits), a
// string, or an array (skipped).
func (b *ggufReader) value(typ uint32, depth int) (*int, *string, error) {
	switch typ {
	case 8:
		s := b.str(ggufMaxString)
		return nil, &s, b.err
	case 9:
		if depth >= ggufMaxDepth {
			return nil, nil, fmt.Errorf("arrays nested deeper than %d", ggufMaxDepth)
		}
		et := b.u32()
		n := b.u64()
		if b.err != nil {
			return nil, nil, b.err
		}
		if n > ggufMaxArray {
			return nil, nil, fmt.Errorf("an array of %d values, above %d", n, ggufMaxArray)
		}
		if sz, ok := ggufSizes[et]; ok {
			b.skip(n * sz)
			return nil, nil, b.err
		}
		for i := uint64(0); i < n; i++ {
			if _, _, err := b.value(et, depth+1); err != nil {
				return nil, nil, err
			}
		}
		return nil, nil, nil
	}
	sz, ok := ggufSizes[typ]
	if !ok {
		return nil, nil, fmt.Errorf("value type %d unknown", typ)
	}
	p := b.read(int(sz))
	if p == nil {
		return nil, nil, b.err
	}
	var v uint64
	switch sz {
	case 1:
		v = uint64(p[0])
	case 2:
		v = uint64(binary.LittleEndian.Uint16(p))
	case 4:
		v = uint64(binary.LittleEndian.Uint32(p))
	case 8:
		v = binary.LittleEndian.Uint64(p)
	}
	switch typ {
	case 6, 12: // floats: not a shape
		return nil, nil, nil
	case 1, 3, 5, 11: // signed: sign-extend
		shift := 64 - 8*sz
		v = uint64(int64(v<<shift) >> shift)
		if int64(v) < 0 {
			return nil, nil, nil
		}
	}
	if v > math.MaxInt32 {
		return nil, nil, nil
	}
	i := int(v)
	return &i, nil, nil
}

// truncate cuts s to at most n bytes, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
