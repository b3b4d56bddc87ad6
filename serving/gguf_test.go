package serving_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/serving"
)

// gguf writes a GGUF v3 header as llama.cpp's gguf writer lays it out
// (little-endian; strings as a u64 length and bytes; arrays as element
// type, count and elements), with the keys of a Llama 3 8B export and a
// vocabulary array that the reader must skip.
func gguf(kv ...any) []byte {
	var b bytes.Buffer
	w := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	str := func(s string) { w(uint64(len(s))); b.WriteString(s) }
	b.WriteString("GGUF")
	w(uint32(3))
	w(uint64(291))
	w(uint64(len(kv) / 2))
	for i := 0; i < len(kv); i += 2 {
		str(kv[i].(string))
		switch v := kv[i+1].(type) {
		case string:
			w(uint32(8))
			str(v)
		case uint32:
			w(uint32(4))
			w(v)
		case float32:
			w(uint32(6))
			w(v)
		case []string:
			w(uint32(9))
			w(uint32(8))
			w(uint64(len(v)))
			for _, s := range v {
				str(s)
			}
		case []int32:
			w(uint32(9))
			w(uint32(5))
			w(uint64(len(v)))
			for _, x := range v {
				w(x)
			}
		}
	}
	return b.Bytes()
}

func llama8B() []byte {
	vocab := make([]string, 5000)
	for i := range vocab {
		vocab[i] = "tok"
	}
	return gguf("general.architecture", "llama", "general.name", "Meta Llama 3 8B Instruct",
		"llama.block_count", uint32(32), "llama.context_length", uint32(8192), "llama.embedding_length", uint32(4096),
		"llama.feed_forward_length", uint32(14336), "llama.attention.head_count", uint32(32),
		"llama.attention.head_count_kv", uint32(8), "llama.rope.freq_base", float32(500000),
		"general.file_type", uint32(15), "tokenizer.ggml.tokens", vocab, "tokenizer.ggml.token_type", make([]int32, 5000))
}

func TestReadGGUF(t *testing.T) {
	g, err := serving.ReadGGUF(bytes.NewReader(append(llama8B(), make([]byte, 1<<20)...)))
	if err != nil {
		t.Fatal(err)
	}
	if g.Architecture != "llama" || g.Layers != 32 || g.Hidden != 4096 || g.Heads != 32 || g.KVHeads != 8 || g.Context != 8192 || g.FFN != 14336 || g.FileType != 15 || g.Tensors != 291 {
		t.Fatalf("read %+v", g)
	}
	m, err := g.Model()
	if err != nil {
		t.Fatal(err)
	}
	// Llama 3 8B's KV cache at f16: 2 x 32 layers x 8 heads x 128 x 2 bytes
	// = 128 KiB a token.
	if got := m.KVCacheBytes(1, 2); got != 131072 {
		t.Errorf("KV cache a token: %.0f bytes, want 131072", got)
	}
	// Sized on a 24 GB GPU: 4.9 GB of Q4_K_M weights, 8 sequences of 8,192
	// tokens (8 GiB of KV cache) and the runtime fit; 64 sequences do not.
	nodes := []serving.Node{{Name: "rtx", Snapshot: onDriver(load(t, rtx4090), "550.90.07")}}
	mod := serving.Model{Name: "llama3-8b-q4", Format: serving.FormatGGUF, Arch: &m, WeightsBytes: 4_920_000_000}
	out, err := serving.Choose(mod, serving.Request{}, nodes, catalogue(t), kb.Default(), nil)
	if err != nil || out.Best.Engine != "llama.cpp" || out.Best.MemoryPerGPUBytes < 4.92e9+8*(1<<30) {
		t.Fatalf("8 sequences: %+v, %v", out, err)
	}
	_, err = serving.Choose(mod, serving.Request{Batch: 64}, nodes, catalogue(t), kb.Default(), nil)
	if err == nil || !strings.Contains(err.Error(), "KV cache of 64 sequences") {
		t.Errorf("64 sequences: %v", err)
	}
}

// Headers that are not GGUF, cut short, or out of bounds are refused with
// what is wrong; a header without the shape says which keys it lacks.
func TestReadGGUFBad(t *testing.T) {
	full := llama8B()
	for name, tc := range map[string]struct {
		b    []byte
		want string
	}{
		"not gguf":  {[]byte("PK\x03\x04 a zip"), "not a GGUF file"},
		"empty":     {nil, "not a GGUF file"},
		"version 1": {append([]byte("GGUF\x01\x00\x00\x00"), make([]byte, 16)...), "version 1"},
		"cut":       {full[:len(full)/2], "ends early"},
		"keys":      {append([]byte("GGUF\x03\x00\x00\x00"), append(make([]byte, 8), 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0)...), "metadata keys"},
	} {
		if _, err := serving.ReadGGUF(bytes.NewReader(tc.b)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	g, err := serving.ReadGGUF(bytes.NewReader(gguf("general.architecture", "mamba")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Model(); err == nil || !strings.Contains(err.Error(), "mamba.block_count") {
		t.Errorf("shape missing: %v", err)
	}
	// A huge declared string is refused before it is allocated.
	huge := append([]byte("GGUF\x03\x00\x00\x00"), make([]byte, 8)...)
	huge = binary.LittleEndian.AppendUint64(huge, 1)
	huge = binary.LittleEndian.AppendUint64(huge, 1<<40)
	if _, err := serving.ReadGGUF(bytes.NewReader(huge)); err == nil || !strings.Contains(err.Error(), "above") {
		t.Errorf("huge key: %v", err)
	}
	if _, err := serving.ReadGGUF(iotestErr{}); err == nil {
		t.Error("a failing reader gave no error")
	}
}

type iotestErr struct{}

func (iotestErr) Read([]byte) (int, error) { return 0, errors.New("disk gone") }

var _ io.Reader = iotestErr{}

// Every cut and every flipped byte of a real-shaped header is read or
// refused, never a panic, and never a shape out of bounds.
func TestReadGGUFMutations(t *testing.T) {
	full := llama8B()[:4096]
	for i := 0; i < len(full); i += 7 {
		_, _ = serving.ReadGGUF(bytes.NewReader(full[:i]))
		b := append([]byte(nil), full...)
		b[i] ^= 0xff
		if g, err := serving.ReadGGUF(bytes.NewReader(b)); err == nil && (g.Layers < 0 || g.Heads < 0) {
			t.Fatalf("flip at %d: %+v", i, g)
		}
	}
}

func FuzzReadGGUF(f *testing.F) {
	f.Add(llama8B()[:2048])
	f.Add(gguf("general.architecture", "llama", "llama.block_count", uint32(2)))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := serving.ReadGGUF(bytes.NewReader(b))
		if err != nil {
			return
		}
		if g.Version != 2 && g.Version != 3 || g.Layers < 0 || g.Hidden < 0 || g.Context < 0 {
			t.Fatalf("accepted %+v", g)
		}
		if m, err := g.Model(); err == nil && (m.Layers <= 0 || m.Heads <= 0) {
			t.Fatalf("a model without a shape: %+v", m)
		}
	})
}

// What the header names is escaped before anything prints it.
func TestReadGGUFEscapes(t *testing.T) {
	g, err := serving.ReadGGUF(bytes.NewReader(gguf("general.architecture", "ll\x1b[2Jama", "general.name", "x\nrm -rf")))
	if err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(g.Architecture+g.Name, "\x1b\n") {
		t.Errorf("read %q and %q raw", g.Architecture, g.Name)
	}
	if _, err := g.Model(); err == nil || strings.Contains(err.Error(), "\x1b") {
		t.Errorf("shape error printed raw: %q", err)
	}
}
