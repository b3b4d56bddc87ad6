package fatbin

import (
	"bytes"
	"debug/elf"
	"errors"
	"io"
	"slices"
	"testing"
	"testing/iotest"
)

// torchLike is a fat binary like PyTorch's CUDA 11.8 wheel restricted to
// Ampere: SASS for sm_80 and sm_86 and PTX for compute_86.
func torchLike() []byte {
	c1 := BuildContainer([]Entry{{KindELF, 80}, {KindELF, 86}, {KindPTX, 86}}, 1000)
	c2 := BuildContainer([]Entry{{KindELF, 80}}, 13)
	return append(append(c1, make([]byte, 8)...), c2...)
}

func TestParseSection(t *testing.T) {
	r, err := ParseSection(torchLike())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.SASS, []int{80, 86}) || !slices.Equal(r.PTX, []int{86}) {
		t.Errorf("SASS %v PTX %v, want [80 86] [86]", r.SASS, r.PTX)
	}
	if r.Containers != 2 || r.Entries != 4 {
		t.Errorf("containers %d entries %d, want 2 and 4", r.Containers, r.Entries)
	}
	if got := r.String(); got != "sm_80 sm_86 compute_86" {
		t.Errorf("String = %q", got)
	}
	if _, err := ParseSection([]byte("not a fatbin at all")); err == nil {
		t.Error("garbage accepted")
	}
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
		if !slices.Equal(res.SASS, []int{80, 86}) || !slices.Equal(res.PTX, []int{86}) {
			t.Errorf("%s: SASS %v PTX %v", name, res.SASS, res.PTX)
		}
	}
	// Size unknown works the same.
	res, err := Scan(bytes.NewReader(b), -1)
	if err != nil || !slices.Equal(res.SASS, []int{80, 86}) {
		t.Errorf("size -1: %v %v", res, err)
	}
}

func TestScanIgnoresMagicOutsideSection(t *testing.T) {
	// A container-shaped blob in .text is not GPU code: the section table
	// says where .nv_fatbin is.
	text := append(bytes.Repeat([]byte{1}, 100), BuildContainer([]Entry{{KindELF, 70}}, 8)...)
	b := BuildELF(text, BuildContainer([]Entry{{KindELF, 90}}, 8))
	res, err := Scan(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.SASS, []int{90}) {
		t.Errorf("SASS %v, want [90]", res.SASS)
	}
	// No .nv_fatbin section at all: nothing.
	b = BuildELF(text, nil)
	res, err = Scan(bytes.NewReader(b), int64(len(b)))
	if err != nil || !res.Empty() || res.Section {
		t.Errorf("no section: %+v %v", res, err)
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
	a := BuildELF([]byte{1}, BuildContainer([]Entry{{KindELF, 75}}, 8))
	b := BuildELF([]byte{1}, BuildContainer([]Entry{{KindPTX, 120}}, 8))
	ra, _ := sc.Scan(bytes.NewReader(a), -1)
	rb, _ := sc.Scan(bytes.NewReader(b), -1)
	if !slices.Equal(ra.SASS, []int{75}) || len(ra.PTX) != 0 || !slices.Equal(rb.PTX, []int{120}) || len(rb.SASS) != 0 {
		t.Errorf("reuse mixed results: %v / %v", ra, rb)
	}
	if CC(120) != "12.0" || CC(86) != "8.6" || ArchName(90, true) != "compute_90" {
		t.Error("arch naming")
	}
}

func FuzzScan(f *testing.F) {
	f.Add(BuildELF([]byte{0x90}, torchLike()))
	f.Add(BuildELF([]byte{0x90}, nil))
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
		if res, _ := ParseSection(b); res != nil {
			checkResult(t, res)
		}
	})
}

func checkResult(t *testing.T, r *Result) {
	t.Helper()
	if r.Containers < 0 || r.Entries < 0 || r.Entries < len(r.SASS)+len(r.PTX)-r.Entries {
		t.Fatalf("bad counts %+v", r)
	}
	for _, s := range [][]int{r.SASS, r.PTX} {
		if !slices.IsSorted(s) {
			t.Fatalf("unsorted %v", s)
		}
		for i, a := range s {
			if a <= 0 || a > 10000 || i > 0 && s[i-1] == a {
				t.Fatalf("bad arch list %v", s)
			}
		}
	}
}
