package compat_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"kiln.dev/kiln/compat/fatbin"
	"kiln.dev/kiln/compat/offload"
)

// The real-binary tests compare kiln's readers of GPU code with what
// independent tools say real binaries hold: NVIDIA's CUDA libraries, CUDA
// programs built by Debian, ROCm libraries and llama.cpp's CUDA backend.
// scripts/realbin.sh fetches them into a cache and writes truth.jsonl there
// (cuobjdump for NVIDIA fatbins, clang-offload-bundler for AMD bundles; see
// testdata/realbin/SOURCES.md). Without KILN_REALBIN the tests skip.

const realbinHowTo = "run scripts/realbin.sh, then KILN_REALBIN=<the cache directory it prints> " +
	"go test ./compat -run TestRealBinaries"

// realbinPTX is one PTX target and its PTX ISA version.
type realbinPTX struct {
	Arch string `json:"arch"`
	ISA  string `json:"isa"`
}

// realbinTruth is one line of truth.jsonl: what the independent tools say one
// ELF file holds. Lists are sorted and unique; all three are empty for a
// file with no GPU code.
type realbinTruth struct {
	File    string       `json:"file"` // relative to the cache directory
	Package string       `json:"package"`
	Version string       `json:"version"`
	Tool    string       `json:"tool"`
	SASS    []string     `json:"sass"`
	PTX     []realbinPTX `json:"ptx"`
	GFX     []string     `json:"gfx"`
	Bytes   int64        `json:"bytes"`
	Note    string       `json:"note,omitempty"`
}

func (l realbinTruth) hasCode() bool { return len(l.SASS)+len(l.PTX)+len(l.GFX) > 0 }

// realbinDir is the cache directory named by KILN_REALBIN, or "" when it
// is not set.
func realbinDir() string { return os.Getenv("KILN_REALBIN") }

func readRealbinTruth(dir string) ([]realbinTruth, error) {
	f, err := os.Open(filepath.Join(dir, "truth.jsonl"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []realbinTruth
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for n := 1; sc.Scan(); n++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var l realbinTruth
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("truth.jsonl line %d: %w", n, err)
		}
		if l.File == "" {
			return nil, fmt.Errorf("truth.jsonl line %d names no file", n)
		}
		out = append(out, l)
	}
	return out, sc.Err()
}

// TestRealBinariesManifest makes a broken setup fail rather than pass with
// nothing compared: once KILN_REALBIN is set, the truth file must be there,
// parse, name files that exist, and cover both vendors.
func TestRealBinariesManifest(t *testing.T) {
	dir := realbinDir()
	if dir == "" {
		t.Skip("KILN_REALBIN is not set: " + realbinHowTo)
	}
	lines, err := readRealbinTruth(dir)
	if err != nil {
		t.Fatalf("KILN_REALBIN=%s: %v (%s)", dir, err, realbinHowTo)
	}
	if len(lines) == 0 {
		t.Fatalf("KILN_REALBIN=%s: truth.jsonl is empty: the setup found no binaries", dir)
	}
	var cuobjdump, bundler, payload, empty int
	seen := map[string]bool{}
	for _, l := range lines {
		if seen[l.File] {
			t.Errorf("%s is listed twice", l.File)
		}
		seen[l.File] = true
		fi, err := os.Stat(filepath.Join(dir, l.File))
		if err != nil {
			t.Errorf("%s (%s %s): %v", l.File, l.Package, l.Version, err)
			continue
		}
		if l.Bytes != 0 && fi.Size() != l.Bytes {
			t.Errorf("%s is %d bytes, truth.jsonl was written for %d: re-run scripts/realbin.sh", l.File, fi.Size(), l.Bytes)
		}
		switch {
		case !l.hasCode():
			empty++
		case len(l.GFX) > 0:
			bundler++
		case strings.HasPrefix(l.Tool, "cuobjdump"):
			cuobjdump++
		default:
			payload++
		}
	}
	if cuobjdump == 0 {
		t.Errorf("no file with NVIDIA code read by cuobjdump: the CUDA part of the setup failed")
	}
	if bundler == 0 {
		t.Errorf("no file with AMD code read by clang-offload-bundler: the ROCm part of the setup failed")
	}
	if payload == 0 {
		t.Logf("no CUDA 12.8+ binary (npm part of the setup skipped?)")
	}
	t.Logf("%d files: %d NVIDIA (cuobjdump), %d NVIDIA (payload decode), %d AMD, %d without GPU code",
		len(lines), cuobjdump, payload, bundler, empty)
}

// TestRealBinaries runs kiln's readers over every file in truth.jsonl and
// compares exactly: the set of SASS targets, the set of (PTX target, PTX
// ISA) pairs and the set of AMD targets. Both readers run on every file, so
// an NVIDIA library must also read as holding no AMD code and the other way
// round.
func TestRealBinaries(t *testing.T) {
	dir := realbinDir()
	if dir == "" {
		t.Skip("KILN_REALBIN is not set: " + realbinHowTo)
	}
	if _, err := os.Stat(filepath.Join(dir, "truth.jsonl")); err != nil {
		t.Skipf("KILN_REALBIN=%s holds no truth.jsonl (%v): %s", dir, err, realbinHowTo)
	}
	lines, err := readRealbinTruth(dir)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu  sync.Mutex
		bad []string
	)
	t.Run("files", func(t *testing.T) {
		for _, l := range lines {
			t.Run(l.File, func(t *testing.T) {
				t.Parallel()
				diffs := compareRealBinary(filepath.Join(dir, l.File), l)
				for _, d := range diffs {
					t.Error(d)
				}
				if len(diffs) > 0 {
					t.Logf("truth from %s (%s %s)", l.Tool, l.Package, l.Version)
					mu.Lock()
					bad = append(bad, l.File+": "+strings.Join(diffs, "; "))
					mu.Unlock()
				}
			})
		}
	})
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Errorf("%d of %d files differ from the independent tools:\n  %s", len(bad), len(lines), strings.Join(bad, "\n  "))
	} else {
		t.Logf("%d files: kiln agrees with the independent tools on every one", len(lines))
	}
}

// compareRealBinary reads path with both readers and lists every difference
// from the truth line.
func compareRealBinary(path string, want realbinTruth) []string {
	f, err := os.Open(path)
	if err != nil {
		return []string{err.Error()}
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return []string{err.Error()}
	}
	size := fi.Size()
	var diffs []string
	if want.Bytes != 0 && size != want.Bytes {
		diffs = append(diffs, fmt.Sprintf("file is %d bytes, truth was written for %d", size, want.Bytes))
	}

	// NVIDIA.
	gotSASS := map[string]string{} // name -> kiln's own description
	gotPTX := map[realbinPTX]string{}
	res, err := new(fatbin.Scanner).Scan(f, size)
	if err != nil {
		diffs = append(diffs, "fatbin.Scan: "+err.Error())
	} else if res != nil {
		for _, c := range res.Codes {
			switch c.Kind {
			case "sass":
				gotSASS[c.Name()] = c.String()
			case "ptx":
				gotPTX[realbinPTX{Arch: c.Name(), ISA: c.ISA}] = c.String()
			default:
				diffs = append(diffs, fmt.Sprintf("fatbin: code of kind %q (%s)", c.Kind, c.String()))
			}
		}
	}
	wantSASS := map[string]bool{}
	for _, s := range want.SASS {
		wantSASS[s] = true
	}
	wantPTX := map[realbinPTX]bool{}
	for _, p := range want.PTX {
		wantPTX[p] = true
	}
	diffs = append(diffs, setDiff("SASS", wantSASS, gotSASS, func(s string) string { return s })...)
	diffs = append(diffs, setDiff("PTX", wantPTX, gotPTX, func(p realbinPTX) string {
		return p.Arch + " (PTX ISA " + p.ISA + ")"
	})...)

	// AMD.
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return append(diffs, err.Error())
	}
	gotGFX := map[string]string{}
	ores, err := new(offload.Scanner).Scan(f, size)
	if err != nil {
		diffs = append(diffs, "offload.Scan: "+err.Error())
	} else if ores != nil {
		for _, tg := range ores.Targets {
			gotGFX[tg.Name()] = tg.Name()
		}
	}
	wantGFX := map[string]bool{}
	for _, g := range want.GFX {
		wantGFX[g] = true
	}
	diffs = append(diffs, setDiff("AMD targets", wantGFX, gotGFX, func(s string) string { return s })...)
	return diffs
}

// setDiff lists what the tools saw and kiln did not, and what kiln reported
// that the tools did not see (with kiln's own description of it).
func setDiff[K comparable](what string, want map[K]bool, got map[K]string, name func(K) string) []string {
	var missing, extra []string
	for k := range want {
		if _, ok := got[k]; !ok {
			missing = append(missing, name(k))
		}
	}
	for k, desc := range got {
		if !want[k] {
			extra = append(extra, desc)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	var out []string
	if len(missing) > 0 {
		out = append(out, fmt.Sprintf("%s: kiln misses %s", what, strings.Join(missing, ", ")))
	}
	if len(extra) > 0 {
		out = append(out, fmt.Sprintf("%s: kiln reports %s, which the tools do not", what, strings.Join(extra, ", ")))
	}
	return out
}
