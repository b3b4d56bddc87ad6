package offload

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

func fuzzSeeds(f *testing.F) [][]byte {
	bundle := torchLike()
	seeds := [][]byte{
		BuildELF([]byte{0x90}, bundle),
		BuildELF([]byte{0x90}, nil),
		bundle,
		[]byte("\x7fELF\x02\x01\x01"),
		codeObject(0x63f, 64),
		codeObject(0x0100095f, 64),
	}
	for _, c := range []struct{ v, m uint16 }{{1, MethodZstd}, {2, MethodZstd}, {3, MethodZlib}, {2, MethodZlib}} {
		cb, err := BuildCompressed(bundle, c.v, c.m, 0)
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, cb, BuildELF([]byte{1}, pad(cb, bundle)))
	}
	return seeds
}

func FuzzScan(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	var sc Scanner
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, size := range []int64{int64(len(b)), -1} {
			res, err := sc.Scan(bytes.NewReader(b), size)
			if err != nil {
				continue
			}
			checkResult(t, res)
		}
	})
}

func checkResult(t *testing.T, r *Result) {
	t.Helper()
	if r.Bundles < 0 || r.Compressed < 0 || r.Compressed > r.Bundles || r.Unreadable < 0 {
		t.Fatalf("bad counts %+v", r)
	}
	if r.CodeObject && (len(r.Targets) != 1 || r.Bundles != 0) {
		t.Fatalf("code object with %+v", r)
	}
	if !r.CodeObject && len(r.Targets) > 0 && r.Bundles == 0 {
		t.Fatalf("targets without bundles: %+v", r)
	}
	names := r.Names()
	if !slices.IsSorted(names) || len(slices.Compact(slices.Clone(names))) != len(names) {
		t.Fatalf("targets not sorted and unique: %v", names)
	}
	for _, tg := range r.Targets {
		if tg.Kind == KindHost || tg.Processor == "" {
			t.Fatalf("bad target %+v", tg)
		}
		if strings.HasPrefix(tg.Processor, "unknown-mach-") {
			continue
		}
		back, err := ParseTarget(tg.Name())
		if err != nil || back.Processor != tg.Processor || back.Features != tg.Features {
			t.Fatalf("target %+v does not parse back: %+v %v", tg, back, err)
		}
	}
}

func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{
		"gfx90a", "gfx90a:xnack-", "gfx906+xnack+sramecc", "gfx10-3-generic",
		"amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-", "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-",
		"hip-amdgcn-amd-amdhsa-gfx906", "host-x86_64-unknown-linux-gnu-", "openmp-amdgcn-amd-amdhsa--gfx942",
		"hip-nvptx64-nvidia-cuda-sm_70", "", ":", "--",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tg, err := ParseTarget(s)
		if err != nil {
			return
		}
		if !isProcessor(tg.Processor) {
			t.Fatalf("%q: processor %q", s, tg.Processor)
		}
		back, err := ParseTarget(tg.Name())
		if err != nil || back.Processor != tg.Processor || back.Features != tg.Features {
			t.Fatalf("%q: %q does not parse back: %+v %v", s, tg.Name(), back, err)
		}
		// Matching never panics, and a target runs on a GPU that is
		// exactly it.
		Matches(tg, s)
		if ok, certain := Matches(tg, tg.Name()); !ok || !certain {
			t.Fatalf("%q does not match itself", tg.Name())
		}
	})
}

func FuzzTargetFromName(f *testing.F) {
	for _, s := range []string{
		"TensileLibrary_gfx90a.co", "Kernels.so-000-gfx90a-xnack-.hsaco", "gfx90a68.kdb", "gfx1030_36.kdb",
		"gfx942130.kdb", "libgfx.so", "gfx", "gfx11-generic_xnack+", "gfx9-4-generic", strings.Repeat("gfx", 100),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tg, ok := TargetFromName(s)
		if !ok {
			return
		}
		if !KnownProcessor(tg.Processor) || !strings.Contains(s, tg.Processor) {
			t.Fatalf("%q: processor %q", s, tg.Processor)
		}
		if back, err := ParseTarget(tg.Name()); err != nil || back.Features != tg.Features {
			t.Fatalf("%q: %q does not parse back: %v", s, tg.Name(), err)
		}
	})
}
