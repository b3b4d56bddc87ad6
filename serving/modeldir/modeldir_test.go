package modeldir_test

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kiln.dev/kiln/serving"
	"kiln.dev/kiln/serving/modeldir"
)

// sparse makes a file of size bytes that takes no disk.
func sparse(t *testing.T, path string, size int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

func write(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// ggufHeader is a GGUF v3 header with a llama shape, then padding.
func ggufHeader() []byte {
	b := []byte("GGUF")
	b = binary.LittleEndian.AppendUint32(b, 3)
	b = binary.LittleEndian.AppendUint64(b, 1)
	kv := []struct {
		k string
		v any
	}{{"general.architecture", "llama"}, {"llama.block_count", uint32(32)}, {"llama.context_length", uint32(8192)},
		{"llama.embedding_length", uint32(4096)}, {"llama.attention.head_count", uint32(32)}, {"llama.attention.head_count_kv", uint32(8)}}
	b = binary.LittleEndian.AppendUint64(b, uint64(len(kv)))
	str := func(s string) { b = binary.LittleEndian.AppendUint64(b, uint64(len(s))); b = append(b, s...) }
	for _, e := range kv {
		str(e.k)
		switch v := e.v.(type) {
		case string:
			b = binary.LittleEndian.AppendUint32(b, 8)
			str(v)
		case uint32:
			b = binary.LittleEndian.AppendUint32(b, 4)
			b = binary.LittleEndian.AppendUint32(b, v)
		}
	}
	return append(b, make([]byte, 4096)...)
}

// config is Mixtral 8x7B's config.json (kept under plan's testdata) with
// the torch_dtype given.
func config(t *testing.T, dtype string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "plan", "testdata", "mixtral-8x7b-config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m["torch_dtype"] = dtype
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A Hugging Face folder: its config gives the shape and precision, its
// shards the weights' size, shards linked into a cache included.
func TestReadSafetensorsFolder(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "config.json"), config(t, "bfloat16"))
	sparse(t, filepath.Join(dir, "model-00001-of-00002.safetensors"), 5<<30)
	blob := filepath.Join(t.TempDir(), "blob")
	sparse(t, blob, 3<<30)
	if err := os.Symlink(blob, filepath.Join(dir, "model-00002-of-00002.safetensors")); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "tokenizer.json"), []byte("{}"))
	m, err := modeldir.Read(dir, "mixtral")
	if err != nil {
		t.Fatal(err)
	}
	if m.Format != serving.FormatSafetensors || m.Arch == nil || m.Arch.Experts != 8 || m.WeightsBytes != 8<<30 || m.Name != "mixtral" || m.Precision != "bf16" || m.Path != dir || m.File != "" {
		t.Errorf("read %+v (arch %+v)", m, m.Arch)
	}
}

// A GGUF file, alone or in a folder: sized by its file, shaped by its
// header.
func TestReadGGUF(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "Llama-3-8B-Q4_K_M.gguf")
	write(t, p, ggufHeader())
	for _, path := range []string{p, dir} {
		m, err := modeldir.Read(path, "")
		if err != nil {
			t.Fatal(err)
		}
		if m.Format != serving.FormatGGUF || m.Arch == nil || m.Arch.Layers != 32 || m.WeightsBytes != int64(len(ggufHeader())) || m.Path != path || m.File != p {
			t.Errorf("%s: read %+v", path, m)
		}
	}
	if m, _ := modeldir.Read(p, ""); m.Name != "Llama-3-8B-Q4_K_M" {
		t.Errorf("name %q", m.Name)
	}
}

// What kiln serve cannot read is refused with what to do, and nothing is
// written.
func TestReadRefusals(t *testing.T) {
	cases := map[string]struct {
		setup func(dir string)
		want  string
	}{
		"no config":  {func(d string) { sparse(t, filepath.Join(d, "model.safetensors"), 10) }, "no config.json"},
		"no weights": {func(d string) { write(t, filepath.Join(d, "config.json"), []byte("{}")) }, "holds no weights"},
		"two ggufs": {func(d string) {
			write(t, filepath.Join(d, "a.gguf"), ggufHeader())
			write(t, filepath.Join(d, "b.gguf"), ggufHeader())
		}, "2 GGUF files (a.gguf, b.gguf)"},
		"mixed": {func(d string) {
			write(t, filepath.Join(d, "a.gguf"), ggufHeader())
			sparse(t, filepath.Join(d, "model.safetensors"), 10)
		}, "both safetensors and GGUF"},
		"bad config": {func(d string) {
			write(t, filepath.Join(d, "config.json"), []byte("{not json"))
			sparse(t, filepath.Join(d, "model.safetensors"), 10)
		}, "config.json"},
		"huge config": {func(d string) {
			sparse(t, filepath.Join(d, "config.json"), 2<<20)
			sparse(t, filepath.Join(d, "model.safetensors"), 10)
		}, "above"},
		"dtype": {func(d string) {
			write(t, filepath.Join(d, "config.json"), config(t, "int3"))
			sparse(t, filepath.Join(d, "model.safetensors"), 10)
		}, `torch_dtype "int3"`},
		"not gguf": {func(d string) { write(t, filepath.Join(d, "x.gguf"), []byte("PK\x03\x04")) }, "not a GGUF file"},
	}
	for name, tc := range cases {
		dir := t.TempDir()
		tc.setup(dir)
		if _, err := modeldir.Read(dir, ""); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	if _, err := modeldir.Read(filepath.Join(t.TempDir(), "gone"), ""); err == nil {
		t.Error("a missing path was read")
	}
	f := filepath.Join(t.TempDir(), "weights.bin")
	write(t, f, []byte("x"))
	if _, err := modeldir.Read(f, ""); err == nil || !strings.Contains(err.Error(), "a file kiln serve reads is a .gguf") {
		t.Errorf("a .bin file: %v", err)
	}
}
