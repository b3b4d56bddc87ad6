package fatbin

import (
	"bytes"
	"debug/elf"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

func sass(arch int) Entry { return Entry{Kind: KindELF, Arch: arch} }
func ptx(arch, major, minor int) Entry {
	return Entry{Kind: KindPTX, Arch: arch, Major: major, Minor: minor}
}

// torchLike is a fat binary like PyTorch's CUDA 11.8 wheel restricted to
// Ampere: SASS for sm_80 and sm_86 and PTX for compute_86 (ISA 7.8).
func torchLike() []byte {
	c1 := BuildContainer([]Entry{sass(80), sass(86), ptx(86, 7, 8)}, 1000)
	c2 := BuildContainer([]Entry{sass(80)}, 13)
	return append(append(c1, make([]byte, 8)...), c2...)
}

func names(cs []Code) string {
	var b bytes.Buffer
	for i, c := range cs {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(c.String())
	}
	return b.String()
}

func scanBytes(t *testing.T, b []byte) *ELFResult {
	t.Helper()
	res, err := Scan(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestBuildELFIsRealELF(t *testing.T) {
	b := BuildELF([]byte("\x90\x90\xc3"), torchLike())
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("debug/elf cannot read the built file: %v", err)
	}
	s := f.Section(".nv_fatbin")
	if s == nil {
		t.Fatal("no .nv_fatbin section")
	}
	data, _ := s.Data()
	if !bytes.Equal(data, torchLike()) {
		t.Error(".nv_fatbin does not hold the containers")
	}
}

func TestScanELF(t *testing.T) {
	b := BuildELF(bytes.Repeat([]byte{0x90}, 300<<10), torchLike())
	for name, r := range map[string]io.Reader{
		"whole":      bytes.NewReader(b),
		"one byte":   iotest.OneByteReader(bytes.NewReader(b)),
		"half reads": iotest.HalfReader(bytes.NewReader(b)),
	} {
		res, err := Scan(r, int64(len(b)))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !res.Section || !res.SectionsRead {
			t.Errorf("%s: section %v read %v", name, res.Section, res.SectionsRead)
		}
		if got := res.String(); got != "sm_80 sm_86 compute_86 (PTX ISA 7.8)" {
			t.Errorf("%s: %q", name, got)
		}
		if res.Containers != 2 || res.Entries != 4 {
			t.Errorf("%s: containers %d entries %d, want 2 and 4", name, res.Containers, res.Entries)
		}
	}
	// Size unknown works the same.
	res, err := Scan(bytes.NewReader(b), -1)
	if err != nil || names(res.SASS()) != "sm_80 sm_86" {
		t.Errorf("size -1: %v %v", res, err)
	}
}

// TestPTXISAAndVariants: the PTX ISA comes from the entry header; the
// variant of code for 9.0 and later from the payload (PTX .target line,
// cubin options), compressed with zstd or not. Two PTX of one architecture
// but different ISA versions are two codes.
func TestPTXISAAndVariants(t *testing.T) {
	z := func(e Entry) Entry { e.Flags = 0x8011; return e }
	withV := func(e Entry, v string) Entry { e.Variant = v; return e }
	fb := BuildContainer([]Entry{
		sass(86), z(sass(89)),
		withV(sass(90), "a"), z(withV(sass(100), "f")), z(withV(sass(120), "a")), sass(100),
		z(ptx(75, 9, 1)), ptx(80, 8, 5), ptx(80, 7, 8), z(withV(ptx(90, 8, 4), "a")), ptx(120, 8, 7),
	}, 3000)
	res := scanBytes(t, BuildELF([]byte{1}, fb))
	want := "sm_86 sm_89 sm_90a sm_100 sm_100f sm_120a compute_75 (PTX ISA 9.1) compute_80 (PTX ISA 7.8) compute_80 (PTX ISA 8.5) compute_90a (PTX ISA 8.4) compute_120 (PTX ISA 8.7)"
	if got := res.String(); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	for _, c := range res.Codes {
		if c.Arch == 89 && !c.Compressed || c.Arch == 86 && c.Compressed {
			t.Errorf("%s: compressed %v", c, c.Compressed)
		}
	}
}

// A cubin whose payload names no target and whose ELF flags are of the new
// layout: for 9.0 and later the variant is unknown, never plain.
func TestVariantUnreadable(t *testing.T) {
	h := make([]byte, 64)
	copy(h, "\x7fELF")
	h[4], h[5], h[8] = 2, 1, 8
	for _, tc := range []struct {
		payload []byte
		arch    int
		want    string
	}{
		{h, 100, VariantUnknown},
		{[]byte("garbage"), 90, VariantUnknown},
		{append(append([]byte{}, h...), "-arch sm_90 -m 64"...), 90, VariantPlain},
		{append(append([]byte{}, h...), "-arch=sm_103f"...), 103, VariantFamily},
		{append(append([]byte{}, h...), "-arch sm_86 "...), 90, VariantUnknown}, // names another arch
	} {
		if got := cubinVariant(tc.payload, tc.arch); got != tc.want {
			t.Errorf("cubinVariant(%q, %d) = %q, want %q", tc.payload[min(64, len(tc.payload)):], tc.arch, got, tc.want)
		}
	}
	// ABI version 7 (CUDA 12.x): EF_CUDA_ACCELERATORS 0x800 with the SM in the low byte.
	old := make([]byte, 64)
	copy(old, "\x7fELF")
	old[4], old[8] = 2, 7
	old[48], old[49] = 90, 0x08|0x05
	if got := cubinVariant(old, 90); got != VariantArch {
		t.Errorf("ABI 7 e_flags 0x%x: %q, want a", 0xd5a, got)
	}
	old[49] = 0x05
	if got := cubinVariant(old, 90); got != VariantPlain {
		t.Errorf("ABI 7 without accelerators: %q", got)
	}
	if ptxVariant([]byte(".version 8.0\n.target sm_90a, texmode_independent\n"), 90) != VariantArch ||
		ptxVariant([]byte(".version 8.0\n"), 90) != VariantUnknown {
		t.Error("ptxVariant")
	}
}

func TestLZ4Block(t *testing.T) {
	// "abcabcabcabc-end": literals "abc", a match of 9 at offset 3, then
	// the literals "-end".
	src := []byte{0x35, 'a', 'b', 'c', 3, 0, 0x40, '-', 'e', 'n', 'd'}
	got, err := lz4Block(src, 1<<20)
	if err != nil || string(got) != "abcabcabcabc-end" {
		t.Errorf("lz4Block = %q, %v", got, err)
	}
	if _, err := lz4Block([]byte{0x10, 'a', 9, 0}, 100); err == nil {
		t.Error("an offset past the output was accepted")
	}
	if got, _ := lz4Block(src, 5); len(got) != 5 {
		t.Errorf("limit not kept: %d bytes", len(got))
	}
}

func TestParseTarget(t *testing.T) {
	for in, want := range map[string]Code{
		"sm_90a":       {Kind: SASS, Arch: 90, Variant: "a"},
		"compute_100f": {Kind: PTX, Arch: 100, Variant: "f"},
		"sm_86":        {Kind: SASS, Arch: 86},
		"120a":         {Kind: SASS, Arch: 120, Variant: "a"},
	} {
		got, err := ParseTarget(in)
		if err != nil || got != want {
			t.Errorf("ParseTarget(%q) = %+v, %v", in, got, err)
		}
		if got.Name() != in && in != "120a" {
			t.Errorf("Name() = %q, want %q", got.Name(), in)
		}
	}
	for _, bad := range []string{"", "sm_", "sm_x", "gfx90a", "sm_1234", "compute_9"} {
		if _, err := ParseTarget(bad); err == nil {
			t.Errorf("ParseTarget(%q) accepted", bad)
		}
	}
	if CompareISA("8.5", "8.10") >= 0 || CompareISA("9.0", "8.8") <= 0 || CompareISA("7.8", "7.8") != 0 {
		t.Error("CompareISA")
	}
}

func TestScanIgnoresMagicOutsideSection(t *testing.T) {
	// A container-shaped blob in .text is not GPU code: the section table
	// says where .nv_fatbin is.
	text := append(bytes.Repeat([]byte{1}, 100), BuildContainer([]Entry{sass(70)}, 8)...)
	b := BuildELF(text, BuildContainer([]Entry{sass(90)}, 8))
	if got := scanBytes(t, b).String(); got != "sm_90" {
		t.Errorf("got %q, want sm_90", got)
	}
	// No .nv_fatbin section at all: nothing.
	b = BuildELF(text, nil)
	res := scanBytes(t, b)
	if !res.Empty() || res.Section {
		t.Errorf("no section: %+v", res)
	}
}

func TestScanNotELF(t *testing.T) {
	_, err := Scan(bytes.NewReader([]byte("#!/bin/sh\necho hi\n")), 18)
	if !errors.Is(err, ErrNotELF) {
		t.Errorf("err = %v, want ErrNotELF", err)
	}
}

func TestScannerReuse(t *testing.T) {
	var sc Scanner
	a := BuildELF([]byte{1}, BuildContainer([]Entry{Entry{Kind: KindELF, Arch: 120, Variant: "a"}}, 8))
	b := BuildELF([]byte{1}, BuildContainer([]Entry{Entry{Kind: KindELF, Arch: 120}}, 8))
	ra, _ := sc.Scan(bytes.NewReader(a), -1)
	rb, _ := sc.Scan(bytes.NewReader(b), -1)
	if ra.String() != "sm_120a" || rb.String() != "sm_120" {
		t.Errorf("reuse mixed results: %v / %v", ra, rb)
	}
	if CC(120) != "12.0" || CC(86) != "8.6" {
		t.Error("arch naming")
	}
}

func FuzzScan(f *testing.F) {
	f.Add(BuildELF([]byte{0x90}, torchLike()))
	f.Add(BuildELF([]byte{0x90}, nil))
	f.Add(BuildELF([]byte{0x90}, BuildContainer([]Entry{{Kind: KindELF, Arch: 100, Flags: 0x8011, Variant: "a"}, {Kind: KindPTX, Arch: 90, Flags: 0x2011}}, 100)))
	f.Add(torchLike())
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, size := range []int64{int64(len(b)), -1} {
			res, err := Scan(bytes.NewReader(b), size)
			if err != nil {
				continue
			}
			checkResult(t, &res.Result)
		}
	})
}

func FuzzLZ4Block(f *testing.F) {
	f.Add([]byte{0x35, 'a', 'b', 'c', 3, 0, 0x40, '-', 'e', 'n', 'd'})
	f.Add([]byte{0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		out, _ := lz4Block(b, 1<<16)
		if len(out) > 1<<16 {
			t.Fatalf("%d bytes out, limit 65536", len(out))
		}
	})
}

func checkResult(t *testing.T, r *Result) {
	t.Helper()
	if r.Containers < 0 || r.Entries < 0 || len(r.Codes) > r.Entries {
		t.Fatalf("bad counts %+v", r)
	}
	for i, c := range r.Codes {
		if c.Arch <= 0 || c.Arch > 10000 || c.Kind != SASS && c.Kind != PTX {
			t.Fatalf("bad code %+v", c)
		}
		if i > 0 && !r.Codes[i-1].less(c) {
			t.Fatalf("codes not sorted and unique: %v", r.Codes)
		}
		if c.Kind == PTX && c.ISA == "" || c.Kind == SASS && c.ISA != "" {
			t.Fatalf("ISA on the wrong kind: %+v", c)
		}
	}
}
