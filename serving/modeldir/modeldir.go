// Package modeldir reads a model as it lies on disk (a Hugging Face style
// folder of config.json and safetensors files, or one GGUF file) into what
// kiln serve sizes it by: serving.Model. It reads config.json and GGUF
// headers, never the weights.
package modeldir

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"kiln.dev/kiln/plan"
	"kiln.dev/kiln/serving"
)

// maxConfigBytes bounds config.json: real ones are a few KiB.
const maxConfigBytes = 1 << 20

// maxEntries bounds the folder's listing.
const maxEntries = 100_000

// Read reads the model at path: a folder with config.json and *.safetensors
// (sharded or not), a folder with one *.gguf, or a *.gguf file. name is
// what clients will ask for; "" takes the folder's or file's name.
func Read(path, name string) (serving.Model, error) {
	m, err := read(path, name)
	if err != nil {
		return m, err
	}
	if m.Path, err = filepath.Abs(path); err != nil {
		return serving.Model{}, fmt.Errorf("model %s: %w", path, err)
	}
	if m.File != "" {
		if m.File, err = filepath.Abs(m.File); err != nil {
			return serving.Model{}, fmt.Errorf("model %s: %w", path, err)
		}
	}
	return m, nil
}

func read(path, name string) (serving.Model, error) {
	st, err := os.Stat(path)
	if err != nil {
		return serving.Model{}, fmt.Errorf("model %s: %w", path, err)
	}
	if name == "" {
		name = strings.TrimSuffix(filepath.Base(filepath.Clean(path)), ".gguf")
	}
	if !st.IsDir() {
		if !strings.HasSuffix(strings.ToLower(path), ".gguf") {
			return serving.Model{}, fmt.Errorf("model %s: a file kiln serve reads is a .gguf; a safetensors model is a folder with its config.json", path)
		}
		return readGGUF(path, name, st.Size())
	}
	entries, err := readDirBounded(path)
	if err != nil {
		return serving.Model{}, fmt.Errorf("model %s: %w", path, err)
	}
	var ggufs, shards []string
	var weights int64
	hasConfig := false
	for _, e := range entries {
		n := e.Name()
		if !e.Type().IsRegular() && e.Type()&os.ModeSymlink == 0 {
			continue
		}
		switch low := strings.ToLower(n); {
		case low == "config.json":
			hasConfig = true
		case strings.HasSuffix(low, ".gguf"):
			ggufs = append(ggufs, n)
		case strings.HasSuffix(low, ".safetensors"):
			fi, err := os.Stat(filepath.Join(path, n)) // follows a link into a cache, as Hugging Face's cache does
			if err != nil {
				return serving.Model{}, fmt.Errorf("model %s: %w", path, err)
			}
			shards = append(shards, n)
			weights += fi.Size()
		}
	}
	switch {
	case len(shards) > 0 && len(ggufs) > 0:
		return serving.Model{}, fmt.Errorf("model %s holds both safetensors and GGUF files; give the GGUF file itself, or a folder of one format", path)
	case len(ggufs) > 1:
		sort.Strings(ggufs)
		return serving.Model{}, fmt.Errorf("model %s holds %d GGUF files (%s); give the one to serve", path, len(ggufs), strings.Join(ggufs, ", "))
	case len(ggufs) == 1:
		p := filepath.Join(path, ggufs[0])
		fi, err := os.Stat(p)
		if err != nil {
			return serving.Model{}, fmt.Errorf("model %s: %w", path, err)
		}
		return readGGUF(p, name, fi.Size())
	case len(shards) == 0:
		return serving.Model{}, fmt.Errorf("model %s holds no weights kiln serve reads (*.safetensors with config.json, or a *.gguf)", path)
	case !hasConfig:
		return serving.Model{}, fmt.Errorf("model %s has safetensors weights but no config.json: kiln cannot tell its shape", path)
	}
	b, err := readBounded(filepath.Join(path, "config.json"), maxConfigBytes)
	if err != nil {
		return serving.Model{}, fmt.Errorf("model %s: config.json: %w", path, err)
	}
	arch, err := plan.ParseHFConfig(b, name)
	if err != nil {
		return serving.Model{}, fmt.Errorf("model %s: %w", path, err)
	}
	if err := arch.Validate(); err != nil {
		return serving.Model{}, fmt.Errorf("model %s: config.json: %w", path, err)
	}
	prec, err := precision(b)
	if err != nil {
		return serving.Model{}, fmt.Errorf("model %s: config.json: %w", path, err)
	}
	return serving.Model{Name: name, Format: serving.FormatSafetensors, Arch: &arch, Precision: prec, WeightsBytes: weights}, nil
}

// precision is the weights' precision from config.json's torch_dtype (or
// dtype); "" when it says none (plan's default, bf16).
func precision(b []byte) (string, error) {
	var c struct {
		TorchDtype string `json:"torch_dtype"`
		Dtype      string `json:"dtype"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return "", err
	}
	d := strings.ToLower(c.TorchDtype)
	if d == "" {
		d = strings.ToLower(c.Dtype)
	}
	switch d {
	case "", "auto":
		return "", nil
	case "bfloat16", "bf16":
		return "bf16", nil
	case "float16", "fp16", "half":
		return "fp16", nil
	case "float32", "fp32", "float":
		return "fp32", nil
	case "float8_e4m3fn", "float8_e5m2", "fp8":
		return "fp8", nil
	}
	return "", fmt.Errorf("torch_dtype %q is not one kiln sizes (bfloat16, float16, float32, float8)", d)
}

func readGGUF(path, name string, size int64) (serving.Model, error) {
	f, err := os.Open(path)
	if err != nil {
		return serving.Model{}, fmt.Errorf("model %s: %w", path, err)
	}
	defer f.Close()
	g, err := serving.ReadGGUF(f)
	if err != nil {
		return serving.Model{}, fmt.Errorf("model %s: %w", path, err)
	}
	m := serving.Model{Name: name, Format: serving.FormatGGUF, WeightsBytes: size, File: path}
	if arch, err := g.Model(); err == nil {
		m.Arch = &arch
	}
	return m, nil
}

func readDirBounded(dir string) ([]os.DirEntry, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	entries, err := f.ReadDir(maxEntries + 1)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if len(entries) > maxEntries {
		return nil, fmt.Errorf("more than %d entries: not a model folder", maxEntries)
	}
	return entries, nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("above %d bytes: not a model's config", limit)
	}
	return b, nil
}
