package offload

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
)

// codeObject is a stand-in for a device code object: an AMDGPU ELF header
// and filler.
func codeObject(flags uint32, n int) []byte {
	body := make([]byte, n)
	for i := range body {
		body[i] = byte(i*7 + 3)
	}
	return BuildCodeObject(abiVersionV4+1, flags, body)
}

// torchLike is a bundle like those of a PyTorch ROCm wheel: a host entry
// and code for a few targets.
func torchLike() []byte {
	return BuildBundle([]BundleEntry{
		{ID: "host-x86_64-unknown-linux-gnu-"},
		{ID: "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-", Object: codeObject(0x63f, 3000)},
		{ID: "hipv4-amdgcn-amd-amdhsa--gfx942", Object: codeObject(0x54c, 5000)},
		{ID: "hipv4-amdgcn-amd-amdhsa--gfx1100", Object: codeObject(0x041, 4000)},
	}, 4096)
}

func mustCompress(t testing.TB, b []byte, version, method uint16, opts int) []byte {
	t.Helper()
	c, err := BuildCompressed(b, version, method, opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// pad concatenates bundles as the linker lays out .hip_fatbin: each aligned
// to 4096 with zeros between.
func pad(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		for len(out)%4096 != 0 {
			out = append(out, 0)
		}
		out = append(out, p...)
	}
	return out
}

func scanAll(t *testing.T, b []byte) *Result {
	t.Helper()
	var last *Result
	for name, r := range map[string]io.Reader{
		"whole":      bytes.NewReader(b),
		"one byte":   iotest.OneByteReader(bytes.NewReader(b)),
		"half reads": iotest.HalfReader(bytes.NewReader(b)),
	} {
		for _, size := range []int64{int64(len(b)), -1} {
			res, err := Scan(r, size)
			if err != nil {
				t.Fatalf("%s size %d: %v", name, size, err)
			}
			if last != nil && (res.String() != last.String() || res.Bundles != last.Bundles || res.Compressed != last.Compressed || res.Unreadable != last.Unreadable) {
				t.Fatalf("%s size %d: %+v differs from %+v", name, size, res, last)
			}
			last = res
			r = bytes.NewReader(b)
		}
	}
	return last
}

func TestScanUncompressed(t *testing.T) {
	b := BuildELF(bytes.Repeat([]byte{0x90}, 300<<10), torchLike())
	if _, err := elf.NewFile(bytes.NewReader(b)); err != nil {
		t.Fatalf("debug/elf cannot read the built file: %v", err)
	}
	res := scanAll(t, b)
	if got := res.String(); got != "gfx1100 gfx90a:xnack- gfx942" {
		t.Errorf("targets %q", got)
	}
	if res.Bundles != 1 || res.Compressed != 0 || res.Unreadable != 0 || res.CodeObject {
		t.Errorf("counts %+v", res)
	}
	if res.Targets[0].Kind != KindHIPv4 || res.Targets[0].Triple != TripleAMDHSA {
		t.Errorf("target %+v", res.Targets[0])
	}
}

func TestScanCompressed(t *testing.T) {
	bundle := torchLike()
	for _, c := range []struct {
		name            string
		version, method uint16
		opts            int
	}{
		{"zstd v2 stream", 2, MethodZstd, 0},
		{"zstd v2 one shot", 2, MethodZstd, ZstdSingleSegment},
		{"zstd v3", 3, MethodZstd, 0},
		{"zstd v1", 1, MethodZstd, ZstdSingleSegment},
		{"zlib v2", 2, MethodZlib, 0},
		{"zlib v3", 3, MethodZlib, 0},
		{"zlib v1", 1, MethodZlib, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			cb := mustCompress(t, bundle, c.version, c.method, c.opts)
			b := BuildELF([]byte{0x90}, cb)
			res := scanAll(t, b)
			if got := res.String(); got != "gfx1100 gfx90a:xnack- gfx942" {
				t.Errorf("targets %q", got)
			}
			if res.Bundles != 1 || res.Compressed != 1 || res.Unreadable != 0 {
				t.Errorf("counts %+v", res)
			}
		})
	}
}

func TestScanConcatenated(t *testing.T) {
	// A .hip_fatbin of several translation units: uncompressed and
	// compressed bundles, aligned and padded.
	b1 := BuildBundle([]BundleEntry{{ID: "host-x86_64-unknown-linux-gnu-"}, {ID: "hipv4-amdgcn-amd-amdhsa--gfx906:xnack-", Object: codeObject(0x22f, 100)}}, 4096)
	b2 := BuildBundle([]BundleEntry{{ID: "host-x86_64-unknown-linux-gnu-"}, {ID: "hipv4-amdgcn-amd-amdhsa--gfx1030", Object: codeObject(0x036, 100)}, {ID: "hipv4-amdgcn-amd-amdhsa--gfx11-generic", Object: codeObject(0x01000054, 100)}}, 4096)
	// A big bundle: its compressed data span many zstd blocks.
	big := make([]byte, 3<<20)
	for i := range big {
		big[i] = byte(i * i >> 5)
	}
	b3 := BuildBundle([]BundleEntry{{ID: "host-x86_64-unknown-linux-gnu-"}, {ID: "hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-", Object: append(codeObject(0xe4c, 0), big...)}}, 4096)
	fat := pad(b1, mustCompress(t, b2, 2, MethodZstd, 0), mustCompress(t, b3, 3, MethodZstd, 0), mustCompress(t, torchLike(), 2, MethodZlib, 0))
	b := BuildELF(bytes.Repeat([]byte{0xcc}, 1<<20), fat)
	res := scanAll(t, b)
	want := []string{"gfx1030", "gfx11-generic", "gfx1100", "gfx906:xnack-", "gfx90a:xnack-", "gfx942", "gfx942:sramecc+:xnack-"}
	if !slices.Equal(res.Names(), want) {
		t.Errorf("targets %v, want %v", res.Names(), want)
	}
	if res.Bundles != 4 || res.Compressed != 3 || res.Unreadable != 0 {
		t.Errorf("counts %+v", res)
	}
}

func TestScanIgnoresBundlesOutsideSection(t *testing.T) {
	// A bundle-shaped blob in .text is not what HIP loads: the section
	// table says where .hip_fatbin is.
	decoy := BuildBundle([]BundleEntry{{ID: "hipv4-amdgcn-amd-amdhsa--gfx803", Object: codeObject(0x2a, 10)}}, 1)
	text := append(bytes.Repeat([]byte{1}, 100), decoy...)
	b := BuildELF(text, torchLike())
	res := scanAll(t, b)
	if got := res.String(); got != "gfx1100 gfx90a:xnack- gfx942" {
		t.Errorf("targets %q", got)
	}
	// No .hip_fatbin at all: nothing.
	b = BuildELF(text, nil)
	res = scanAll(t, b)
	if !res.Empty() || res.Bundles != 0 {
		t.Errorf("no section: %+v", res)
	}
	// The section table cut off (a truncated stream whose size is not
	// known): bundles are kept on the strength of their headers.
	b = BuildELF(text, torchLike())
	shoff := binary.LittleEndian.Uint64(b[0x28:])
	cut := b[:shoff]
	res, err := Scan(bytes.NewReader(cut), -1)
	if err != nil {
		t.Fatal(err)
	}
	if got := res.String(); got != "gfx1100 gfx803 gfx90a:xnack- gfx942" || res.Bundles != 2 {
		t.Errorf("no section table: %q %+v", got, res)
	}
}

func TestScanTruncated(t *testing.T) {
	// The stream ends inside a bundle's code objects.
	bundle := torchLike()
	raw := bundle[:len(bundle)-100]
	res, err := Scan(bytes.NewReader(raw), int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	if res.Unreadable != 1 || res.Bundles != 0 || !res.Empty() {
		t.Errorf("truncated code objects: %+v", res)
	}
	// The stream ends inside the header.
	raw = bundle[:100]
	for _, size := range []int64{100, -1} {
		res, err = Scan(bytes.NewReader(raw), size)
		if err != nil {
			t.Fatal(err)
		}
		if res.Unreadable != 1 || res.Bundles != 0 {
			t.Errorf("truncated header, size %d: %+v", size, res)
		}
	}
	// A compressed bundle cut short, in a .hip_fatbin section whose size
	// says so.
	cb := mustCompress(t, torchLike(), 2, MethodZstd, 0)
	b := BuildELF([]byte{0x90}, cb[:len(cb)/2])
	res = scanAll(t, b)
	if res.Unreadable != 1 || res.Bundles != 0 {
		t.Errorf("truncated compressed: %+v", res)
	}
	// Compressed data cut right after the header.
	res, err = Scan(bytes.NewReader(cb[:40]), 40)
	if err != nil || res.Unreadable != 1 {
		t.Errorf("compressed cut at 40: %+v %v", res, err)
	}
}

func TestScanUnreadable(t *testing.T) {
	cb := mustCompress(t, torchLike(), 2, MethodZstd, 0)
	for name, mutate := range map[string]func([]byte){
		"unknown method":  func(b []byte) { binary.LittleEndian.PutUint16(b[6:], 2) },
		"unknown version": func(b []byte) { binary.LittleEndian.PutUint16(b[4:], 4) },
		"corrupt data":    func(b []byte) { copy(b[24+8:], bytes.Repeat([]byte{0xff}, 64)) },
		"not compressed":  func(b []byte) { copy(b[24:], "garbage!") },
	} {
		b := append([]byte(nil), cb...)
		mutate(b)
		res := scanAll(t, BuildELF([]byte{0x90}, b))
		if res.Unreadable != 1 || res.Bundles != 0 || !res.Empty() {
			t.Errorf("%s: %+v", name, res)
		}
	}
	// A corrupt uncompressed bundle: the second entry's id is junk.
	bundle := torchLike()
	i := bytes.Index(bundle, []byte("hipv4-amdgcn-amd-amdhsa--gfx942"))
	bundle[i+3] = 0
	res := scanAll(t, BuildELF([]byte{0x90}, bundle))
	if res.Unreadable != 1 || res.Bundles != 0 {
		t.Errorf("corrupt entry: %+v", res)
	}
}

func TestScanGarbage(t *testing.T) {
	// Magics in random places of a file with no section table read, and
	// the strings clang itself holds: nothing comes of them.
	junk := bytes.Repeat([]byte("__CLANG_OFFLOAD_BUNDLE__\x00CCOB\x00\x00CCOB\x01\x00\x07\x00__CLANG_OFFLOAD_BUNDLE__\xff\xff\xff\xff\xff\xff\xff\xff"), 5000)
	withCount := append([]byte(BundleMagic), 1, 0, 0, 0, 0, 0, 0, 0)
	withCount = append(withCount, make([]byte, 16)...)
	withCount = append(withCount, 5, 0, 0, 0, 0, 0, 0, 0)
	withCount = append(withCount, "hello"...)
	junk = append(junk, bytes.Repeat(withCount, 100)...)
	for name, b := range map[string][]byte{
		"in .text":     BuildELF(junk, nil),
		"in section":   BuildELF([]byte{1}, junk),
		"bare":         append([]byte(CompressedMagic+"\x02\x00\x01\x00"), junk...),
		"no sht (cut)": BuildELF(junk, nil)[:len(junk)+64],
	} {
		res, err := Scan(bytes.NewReader(b), -1)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !res.Empty() || res.Bundles != 0 {
			t.Errorf("%s: %+v", name, res)
		}
		if name != "in section" && res.Unreadable != 0 {
			t.Errorf("%s: unreadable %d", name, res.Unreadable)
		}
	}
}

func TestScanCodeObject(t *testing.T) {
	for flags, want := range map[uint32]string{
		0x63f:      "gfx90a:xnack-",
		0xe4c:      "gfx942:sramecc+:xnack-",
		0x04e:      "gfx1201",
		0x01000054: "gfx11-generic",
		0x049:      "unknown-mach-0x49",
	} {
		b := codeObject(flags, 200<<10)
		res := scanAll(t, b)
		if !res.CodeObject || res.String() != want || res.Bundles != 0 {
			t.Errorf("flags 0x%x: %+v, want %q", flags, res, want)
		}
		if res.Targets[0].Kind != KindCodeObject {
			t.Errorf("kind %q", res.Targets[0].Kind)
		}
	}
}

func TestScanBareBundle(t *testing.T) {
	// hipcc --genco and .hipfb files are bundles without an ELF around.
	res := scanAll(t, torchLike())
	if res.String() != "gfx1100 gfx90a:xnack- gfx942" || res.Bundles != 1 {
		t.Errorf("bare: %+v", res)
	}
	res = scanAll(t, mustCompress(t, torchLike(), 3, MethodZlib, 0))
	if res.String() != "gfx1100 gfx90a:xnack- gfx942" || res.Compressed != 1 {
		t.Errorf("bare compressed: %+v", res)
	}
}

func TestScanNotELF(t *testing.T) {
	for _, b := range []string{"#!/bin/sh\necho hi\n", "", "\x7fELF\x02\x02\x01", strings.Repeat("\x7fELF\x02\x02", 20)} {
		_, err := Scan(strings.NewReader(b), int64(len(b)))
		if !errors.Is(err, ErrNotELF) {
			t.Errorf("%q: err = %v, want ErrNotELF", b, err)
		}
	}
}

type failReader struct {
	r io.Reader
	n int
}

var errBoom = errors.New("boom")

func (f *failReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errBoom
	}
	p = p[:min(len(p), f.n)]
	n, err := f.r.Read(p)
	f.n -= n
	return n, err
}

func TestScanReadError(t *testing.T) {
	b := BuildELF(bytes.Repeat([]byte{0x90}, 1<<20), torchLike())
	_, err := Scan(&failReader{r: bytes.NewReader(b), n: 500 << 10}, int64(len(b)))
	if !errors.Is(err, errBoom) {
		t.Errorf("err = %v, want the reader's error", err)
	}
}

func TestScannerReuse(t *testing.T) {
	var sc Scanner
	a := BuildELF([]byte{1}, mustCompress(t, BuildBundle([]BundleEntry{{ID: "hipv4-amdgcn-amd-amdhsa--gfx908", Object: codeObject(0x530, 10)}}, 1), 2, MethodZstd, 0))
	b := BuildELF([]byte{1}, mustCompress(t, BuildBundle([]BundleEntry{{ID: "hipv4-amdgcn-amd-amdhsa--gfx1201", Object: codeObject(0x4e, 10)}}, 1), 2, MethodZlib, 0))
	c := BuildELF(bytes.Repeat([]byte{1}, 400<<10), mustCompress(t, BuildBundle([]BundleEntry{{ID: "hipv4-amdgcn-amd-amdhsa--gfx1030", Object: codeObject(0x36, 10)}}, 1), 2, MethodZstd, 0))
	for i := 0; i < 3; i++ {
		ra, _ := sc.Scan(bytes.NewReader(a), -1)
		rb, _ := sc.Scan(bytes.NewReader(b), int64(len(b)))
		rc, _ := sc.Scan(bytes.NewReader(c), int64(len(c)))
		if ra.String() != "gfx908" || rb.String() != "gfx1201" || rc.String() != "gfx1030" {
			t.Errorf("reuse mixed results: %v / %v / %v", ra, rb, rc)
		}
	}
}

func TestParseCCOBFieldSizes(t *testing.T) {
	// The header sizes and field offsets of each version, as clang's
	// RawCompressedBundleHeader lays them out.
	bundle := torchLike()
	for _, v := range []uint16{1, 2, 3} {
		cb := mustCompress(t, bundle, v, MethodZlib, 0)
		h, check := parseCCOB(cb)
		if check != ccobOK {
			t.Fatalf("v%d: %v", v, check)
		}
		wantLen := map[uint16]int{1: 20, 2: 24, 3: 32}[v]
		if h.hdrLen != wantLen || h.uncompressed != uint64(len(bundle)) {
			t.Errorf("v%d: %+v", v, h)
		}
		if v >= 2 && h.total != uint64(len(cb)) {
			t.Errorf("v%d: total %d, want %d", v, h.total, len(cb))
		}
		if !dataLooksCompressed(MethodZlib, cb[h.hdrLen:]) {
			t.Errorf("v%d: data at %d is not zlib", v, h.hdrLen)
		}
	}
}

func TestZstdFrameKinds(t *testing.T) {
	// Both kinds of zstd frame are exercised: one-shot frames are single
	// segment and declare their content size; stream frames carry a
	// window descriptor.
	bundle := torchLike()
	one := mustCompress(t, bundle, 2, MethodZstd, ZstdSingleSegment)[24:]
	stream := mustCompress(t, bundle, 2, MethodZstd, 0)[24:]
	if one[4]&0x20 == 0 {
		t.Errorf("one-shot frame header 0x%02x is not single segment", one[4])
	}
	if stream[4]&0x20 != 0 {
		t.Errorf("stream frame header 0x%02x is single segment", stream[4])
	}
	for _, d := range [][]byte{one, stream} {
		hdr, blocks, err := zstdFrame(d)
		if err != nil || hdr[4]&^0x04 != 0 || hdr[5] != 0x58 || len(blocks) >= len(d) {
			t.Errorf("rewritten header % x, %d of %d bytes, %v", hdr, len(blocks), len(d), err)
		}
	}
	// A frame that needs a dictionary is refused.
	d := append([]byte{0x28, 0xb5, 0x2f, 0xfd, 0x01, 0x58, 7}, make([]byte, 8)...)
	if _, _, err := zstdFrame(d); err == nil {
		t.Error("dictionary frame accepted")
	}
}

func TestScanMemoryBounded(t *testing.T) {
	// A big bundle compressed in one shot: its zstd frame declares a
	// 24 MiB window (single segment). Reading its header must not cost
	// that window.
	big := make([]byte, 24<<20)
	for i := range big {
		big[i] = byte(i>>10) ^ byte(i*13)
	}
	bundle := BuildBundle([]BundleEntry{{ID: "host-x86_64-unknown-linux-gnu-"}, {ID: "hipv4-amdgcn-amd-amdhsa--gfx942", Object: append(codeObject(0x54c, 0), big...)}}, 4096)
	b := BuildELF([]byte{0x90}, mustCompress(t, bundle, 3, MethodZstd, ZstdSingleSegment))
	big, bundle = nil, nil
	var sc Scanner
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	res, err := sc.Scan(bytes.NewReader(b), int64(len(b)))
	runtime.ReadMemStats(&after)
	if err != nil || res.String() != "gfx942" || res.Compressed != 1 {
		t.Fatalf("%+v %v", res, err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 12<<20 {
		t.Errorf("scan allocated %d MiB", got>>20)
	}
}
