package image

import (
	"context"
	"kiln.dev/kiln/textsafe"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"kiln.dev/kiln/compat/imagetest"
)

func torchSpec(arch string) imagetest.Spec {
	return imagetest.Spec{
		Arch: arch, CUDA: "12.1.105", Torch: "2.3.0+cu121", TorchCUDA: "12.1", TorchSASS: []int{80, 86, 90},
		Env: map[string]string{"CUDA_VERSION": "12.1.1", "NVIDIA_REQUIRE_CUDA": "cuda>=12.1"},
		Extra: [][]imagetest.File{{
			// An upper layer deletes the CUDA runtime's symlink and swaps cuBLAS.
			imagetest.Whiteout("usr/local/cuda/lib64/libcublas.so.12.1.105"),
			{Path: "usr/local/cuda/lib64/libcublas.so.12.1.3.1", Body: imagetest.CUDALibrary([]int{80, 90}, nil, 100)},
		}},
	}
}

func factKeys(r *Result) []string {
	var out []string
	for _, f := range r.Facts {
		out = append(out, f.Kind+":"+f.Path+"@"+f.Version)
	}
	return out
}

func TestScanRegistry(t *testing.T) {
	reg := imagetest.NewTestRegistry(t)
	img, err := imagetest.Image(torchSpec(""))
	if err != nil {
		t.Fatal(err)
	}
	ref, err := imagetest.Push(reg.Host, "kiln/torch", "2.3", img)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	opened, err := Open(ctx, ref, OpenOptions{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	if opened.Source != SourceRegistry {
		t.Errorf("source %q", opened.Source)
	}
	cacheDir := t.TempDir()
	cache := NewCache(cacheDir)
	first, err := Scan(ctx, opened, ScanOptions{Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	if first.Env["CUDA_VERSION"] != "12.1.1" || first.Platform != "linux/amd64" || !strings.HasPrefix(first.Digest, "sha256:") {
		t.Errorf("config read as env %v platform %q digest %q", first.Env, first.Platform, first.Digest)
	}
	keys := factKeys(first)
	for _, want := range []string{
		"library:usr/local/cuda/lib64/libcudart.so.12.1.105@12.1.105",
		"library:usr/local/cuda/lib64/libcublas.so.12.1.3.1@12.1.3.1",
		"python-module:usr/local/lib/python3.10/dist-packages/torch/version.py@2.3.0+cu121",
		"gpu-code:usr/local/lib/python3.10/dist-packages/torch/lib/libtorch_cuda.so@",
	} {
		if !slices.Contains(keys, want) {
			t.Errorf("missing %s in %q", want, keys)
		}
	}
	for _, k := range keys {
		if strings.Contains(k, "libcublas.so.12.1.105") {
			t.Errorf("whited-out file survived: %s", k)
		}
	}
	if len(first.Layers) != 4 || first.CompressedBytes <= 0 {
		t.Errorf("layers %d compressed bytes %d", len(first.Layers), first.CompressedBytes)
	}
	for _, l := range first.Layers {
		if l.Cached {
			t.Errorf("layer %s cached on the first scan", l.Digest)
		}
	}
	// Each layer is on disk under its digest.
	entries, _ := os.ReadDir(cacheDir)
	if len(entries) != 5 {
		t.Errorf("cache dir holds %d entries, want 4 layers and images/", len(entries))
	}
	for _, e := range entries {
		if e.Name() == "images" && e.IsDir() {
			continue
		}
		if !strings.HasPrefix(e.Name(), "sha256-") || !strings.HasSuffix(e.Name(), ".json") {
			t.Errorf("cache file %q", e.Name())
		}
	}

	// Second scan: from memory, nothing read.
	second, err := Scan(ctx, opened, ScanOptions{Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	if second.CompressedBytes != 0 || !slices.Equal(factKeys(second), keys) {
		t.Errorf("cached scan read %d bytes; facts equal: %v", second.CompressedBytes, slices.Equal(factKeys(second), keys))
	}
	// A fresh process: from disk.
	third, err := Scan(ctx, opened, ScanOptions{Cache: NewCache(cacheDir)})
	if err != nil {
		t.Fatal(err)
	}
	if third.CompressedBytes != 0 || !slices.Equal(factKeys(third), keys) {
		t.Errorf("disk-cached scan read %d bytes", third.CompressedBytes)
	}
	// An image sharing the base layers reads only its own layers.
	spec := torchSpec("")
	spec.Extra = append(spec.Extra, []imagetest.File{{Path: "app/train.py", Body: []byte("print('hi')\n")}})
	img2, _ := imagetest.Image(spec)
	ref2, err := imagetest.Push(reg.Host, "kiln/torch-app", "1", img2)
	if err != nil {
		t.Fatal(err)
	}
	o2, err := Open(ctx, ref2, OpenOptions{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := Scan(ctx, o2, ScanOptions{Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	cached := 0
	for _, l := range r2.Layers {
		if l.Cached {
			cached++
		}
	}
	if cached != 4 || len(r2.Layers) != 5 {
		t.Errorf("shared base: %d of %d layers cached, want 4 of 5", cached, len(r2.Layers))
	}

	// Both images are recorded, the latest read first, and what was read of
	// each is had again from the cache alone, as an air-gapped server does.
	recs, skipped, err := NewCache(cacheDir).Images()
	if err != nil || skipped != 0 || len(recs) != 2 {
		t.Fatalf("images: %d records, %d skipped, %v", len(recs), skipped, err)
	}
	if recs[0].Ref != ref2 || recs[1].Ref != ref || recs[1].Digest != first.Digest || recs[1].Platform != "linux/amd64" || len(recs[1].Layers) != 4 {
		t.Errorf("records: %+v", recs)
	}
	again, ok := NewCache(cacheDir).Result(recs[1])
	if !ok || !slices.Equal(factKeys(again), keys) || again.Env["CUDA_VERSION"] != "12.1.1" {
		t.Errorf("result from the cache: ok %v, facts equal %v", ok, again != nil && slices.Equal(factKeys(again), keys))
	}
	// A second read of an image replaces its record.
	if _, err := Scan(ctx, opened, ScanOptions{Cache: cache}); err != nil {
		t.Fatal(err)
	}
	if recs, _, _ := NewCache(cacheDir).Images(); len(recs) != 2 || recs[0].Ref != ref {
		t.Errorf("after a second read: %d records, latest %q", len(recs), recs[0].Ref)
	}
	// Records that cannot be read are skipped and counted, never trusted.
	imgDir := filepath.Join(cacheDir, "images")
	for name, body := range map[string][]byte{
		"garbage.json":   []byte("{not json"),
		"version.json":   []byte(`{"version":99,"ref":"x","layers":["sha256:ab"]}`),
		"nolayers.json":  []byte(`{"version":1,"ref":"x","layers":[]}`),
		"baddigest.json": []byte(`{"version":1,"ref":"x","layers":["../../etc/passwd"]}`),
		"control.json":   []byte(`{"version":1,"ref":"lab/x\u001b[2J:1","layers":["sha256:ab"]}`),
		"huge.json":      make([]byte, maxImageRecordBytes+1),
	} {
		if err := os.WriteFile(filepath.Join(imgDir, name), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if recs, skipped, err := NewCache(cacheDir).Images(); err != nil || len(recs) != 2 || skipped != 6 {
		t.Errorf("with bad records: %d records, %d skipped, %v", len(recs), skipped, err)
	}
	// A layer gone from the cache: the image cannot be judged from it.
	if err := os.Remove(NewCache(cacheDir).fileName(recs[1].Layers[0])); err != nil {
		t.Fatal(err)
	}
	if _, ok := NewCache(cacheDir).Result(recs[1]); ok {
		t.Error("result made without one of its layers")
	}
}

func FuzzParseImageRecord(f *testing.F) {
	f.Add([]byte(`{"version":1,"ref":"reg/lab/img:1","platform":"linux/amd64","layers":["sha256:0123"],"read_at":"2026-01-02T03:04:05Z"}`))
	f.Add([]byte(`{"version":1,"ref":"","layers":["sha256:0123"]}`))
	f.Add([]byte(`{"version":1,"ref":"x","layers":["sha256:0123"],"env":{"A":"B"},"labels":{"c":"d"}}`))
	f.Add([]byte("\xef\xbb\xbf{\"version\":1}\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := ParseImageRecord(b)
		if err != nil {
			return
		}
		if rec.Ref == "" || len(rec.Ref) > 1024 || len(rec.Layers) == 0 || len(rec.Layers) > 1000 || textsafe.Printable(rec.Ref) != rec.Ref {
			t.Fatalf("accepted out of bounds: %+v", rec)
		}
		for _, d := range rec.Layers {
			if !validDigest(d) || strings.ContainsAny(d, "/\\") {
				t.Fatalf("accepted layer digest %q", d)
			}
		}
	})
}

func TestOpenIndexPicksPlatform(t *testing.T) {
	reg := imagetest.NewTestRegistry(t)
	amd, _ := imagetest.Image(torchSpec("amd64"))
	armSpec := torchSpec("arm64")
	armSpec.Torch = "2.3.0+cu121.arm"
	arm, _ := imagetest.Image(armSpec)
	ref, err := imagetest.PushIndex(reg.Host, "kiln/multi", "1", amd, arm)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct{ arch, want string }{{"x86_64", "linux/amd64"}, {"aarch64", "linux/arm64"}, {"", "linux/amd64"}} {
		p := PlatformForArch(tc.arch)
		o, err := Open(ctx, ref, OpenOptions{Insecure: true, Platform: &p})
		if err != nil {
			t.Fatal(err)
		}
		r, err := Scan(ctx, o, ScanOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Platform != tc.want {
			t.Errorf("node %q got %s, want %s", tc.arch, r.Platform, tc.want)
		}
	}
	p := v1.Platform{OS: "linux", Architecture: "s390x"}
	if _, err := Open(ctx, ref, OpenOptions{Insecure: true, Platform: &p}); err == nil {
		t.Error("a platform the index lacks was accepted")
	}
}

func TestOpenLayoutAndTarball(t *testing.T) {
	img, err := imagetest.Image(torchSpec(""))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// OCI layout with a two-platform index.
	dir := t.TempDir()
	arm, _ := imagetest.Image(torchSpec("arm64"))
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
	)
	if _, err := layout.Write(dir, idx); err != nil {
		t.Fatal(err)
	}
	p := PlatformForArch("aarch64")
	o, err := Open(ctx, "oci:"+dir, OpenOptions{Platform: &p})
	if err != nil {
		t.Fatal(err)
	}
	r, err := Scan(ctx, o, ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if o.Source != SourceLayout || r.Platform != "linux/arm64" || len(r.Facts) == 0 {
		t.Errorf("layout: source %s platform %s facts %d", o.Source, r.Platform, len(r.Facts))
	}
	// docker save tarball.
	tarPath := filepath.Join(t.TempDir(), "img.tar")
	tag, _ := name.NewTag("kiln/torch:2.3")
	if err := tarball.WriteToFile(tarPath, tag, img); err != nil {
		t.Fatal(err)
	}
	o, err = Open(ctx, tarPath, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := Scan(ctx, o, ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if o.Source != SourceTarball || len(r2.Facts) != len(r.Facts) {
		t.Errorf("tarball: source %s, %d facts vs layout %d", o.Source, len(r2.Facts), len(r.Facts))
	}
	if !slices.Contains(factKeys(r2), "python-module:usr/local/lib/python3.10/dist-packages/torch/version.py@2.3.0+cu121") {
		t.Errorf("tarball facts %q", factKeys(r2))
	}
	// Errors say what was tried.
	if _, err := Open(ctx, "oci:"+filepath.Join(dir, "missing"), OpenOptions{}); err == nil {
		t.Error("missing layout accepted")
	}
	if _, err := Open(ctx, t.TempDir(), OpenOptions{}); err == nil || !strings.Contains(err.Error(), "index.json") {
		t.Errorf("empty dir: %v", err)
	}
	if _, err := Open(ctx, "UPPER/Case:bad tag", OpenOptions{}); err == nil || !strings.Contains(err.Error(), "neither a file") {
		t.Errorf("bad reference: %v", err)
	}
}
