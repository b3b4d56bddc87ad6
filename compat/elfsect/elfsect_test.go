package elfsect_test

import (
	"bytes"
	"debug/elf"
	"errors"
	"testing"

	"kiln.dev/kiln/compat/elfsect"
	"kiln.dev/kiln/compat/fatbin"
)

// stream passes b to Keep in chunks of n bytes, as a reader does.
func stream(t *testing.T, b []byte, size int64, n int) *elfsect.Tables {
	t.Helper()
	h, err := elfsect.ParseHeader(b)
	if err != nil {
		t.Fatal(err)
	}
	tabs := elfsect.NewTables(h, size)
	for pos := 0; pos < len(b); pos += n {
		tabs.Keep(int64(pos), b[pos:min(pos+n, len(b))])
	}
	return tabs
}

// The ranges are those debug/elf reads with the whole file at hand.
func TestSectionsAgreeWithDebugELF(t *testing.T) {
	b := fatbin.BuildELF(bytes.Repeat([]byte{0x90}, 100<<10), []byte("fat binary bytes"))
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	s := f.Section(".nv_fatbin")
	for _, n := range []int{1, 7, 4096, len(b)} {
		ranges, ok := stream(t, b, int64(len(b)), n).Sections(".nv_fatbin")
		if !ok || len(ranges) != 1 || ranges[0] != [2]int64{int64(s.Offset), int64(s.Offset + s.Size)} {
			t.Errorf("chunks of %d: %v %v, want [%d %d]", n, ranges, ok, s.Offset, s.Offset+s.Size)
		}
		if r, ok := stream(t, b, int64(len(b)), n).Sections(".hip_fatbin"); !ok || len(r) != 0 {
			t.Errorf("a section the file lacks: %v %v", r, ok)
		}
	}
}

// A stream cut before the table says it could not read the sections,
// rather than that there are none.
func TestCutStreamIsNotRead(t *testing.T) {
	b := fatbin.BuildELF(make([]byte, 8192), []byte("x"))
	cut := b[:len(b)-100]
	if _, ok := stream(t, cut, -1, 512).Sections(".nv_fatbin"); ok {
		t.Error("a cut table was read")
	}
	if _, err := elfsect.ParseHeader([]byte("#!/bin/sh\n" + string(make([]byte, 60)))); !errors.Is(err, elfsect.ErrNotELF) {
		t.Errorf("a script: %v", err)
	}
	var nilTabs *elfsect.Tables
	nilTabs.Keep(0, b)
	if _, ok := nilTabs.Sections(".nv_fatbin"); ok {
		t.Error("no tables, yet sections")
	}
}

func FuzzSections(f *testing.F) {
	f.Add(fatbin.BuildELF(make([]byte, 512), []byte("x")))
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := elfsect.ParseHeader(b)
		if err != nil {
			return
		}
		for _, size := range []int64{int64(len(b)), -1} {
			tabs := elfsect.NewTables(h, size)
			tabs.Keep(0, b)
			ranges, _ := tabs.Sections(".nv_fatbin")
			for _, r := range ranges {
				if r[0] < 0 || r[1] < r[0] {
					t.Fatalf("bad range %v", r)
				}
			}
		}
	})
}
