package offload

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"kiln.dev/kiln/testenv"
)

// These tests check the reader against LLVM's own tools (Debian: clang-15,
// clang-tools-15, llvm-15, lld-15). Without them they skip with how to
// install them, or fail with KILN_REQUIRE_TOOLS=1 (package testenv).

// Install hints for the LLVM tools the tests run.
const (
	bundlerHint = "apt-get install clang-tools-15 llvm-15 (clang-offload-bundler and llc)"
	clangHint   = "apt-get install clang-15 lld-15"
)

// lookTool finds the first of names on PATH or in LLVM's versioned
// directories.
func lookTool(names ...string) string {
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
		for _, v := range []string{"15", "16", "17", "18", "19", "20"} {
			p := filepath.Join("/usr/lib/llvm-"+v, "bin", n)
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	return ""
}

// needTool finds the first of names as lookTool does; when none is there
// the test skips with hint, or fails with KILN_REQUIRE_TOOLS=1.
func needTool(t *testing.T, hint string, names ...string) string {
	t.Helper()
	if p := lookTool(names...); p != "" {
		return p
	}
	return testenv.Need(t, names[0], hint)
}

func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return string(out)
}

const kernelIR = "define amdgpu_kernel void @k(ptr addrspace(1) %p) {\n  store i32 1, ptr addrspace(1) %p\n  ret void\n}\n"

// llvmTargets are target ids LLVM 15 and later compile, with the llc
// options that give them.
var llvmTargets = []struct {
	id    string
	mcpu  string
	mattr string
}{
	{"gfx906:sramecc+:xnack-", "gfx906", "+sramecc,-xnack"},
	{"gfx908:xnack+", "gfx908", "+xnack"},
	{"gfx90a:xnack-", "gfx90a", "-xnack"},
	{"gfx940", "gfx940", ""},
	{"gfx1030", "gfx1030", ""},
	{"gfx1100", "gfx1100", ""},
}

func TestAgainstClangOffloadBundler(t *testing.T) {
	bundler := needTool(t, bundlerHint, "clang-offload-bundler-15", "clang-offload-bundler")
	llc := needTool(t, bundlerHint, "llc-15", "llc")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "k.ll"), []byte(kernelIR), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "host.o"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	targets := []string{"host-x86_64-unknown-linux-gnu"}
	inputs := []string{"host.o"}
	var want []string
	for i, tg := range llvmTargets {
		obj := filepath.Join(dir, "k"+string(rune('a'+i))+".o")
		args := []string{"-mtriple=amdgcn-amd-amdhsa", "-mcpu=" + tg.mcpu, "-filetype=obj", "k.ll", "-o", obj}
		if tg.mattr != "" {
			args = append(args, "-mattr="+tg.mattr)
		}
		run(t, dir, llc, args...)
		// The code object's e_flags say what the id says.
		co, err := os.ReadFile(obj)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Scan(bytes.NewReader(co), int64(len(co)))
		if err != nil || !res.CodeObject || res.String() != tg.id {
			t.Errorf("llc -mcpu=%s -mattr=%s: %v %v, want %s", tg.mcpu, tg.mattr, res, err, tg.id)
		}
		targets = append(targets, "hipv4-amdgcn-amd-amdhsa--"+tg.id)
		inputs = append(inputs, obj)
		want = append(want, tg.id)
	}
	slices.Sort(want)
	out := filepath.Join(dir, "k.hipfb")
	args := []string{"-type=o", "-bundle-align=4096", "-targets=" + strings.Join(targets, ","), "-output=" + out}
	for _, in := range inputs {
		args = append(args, "-input="+in)
	}
	run(t, dir, bundler, args...)
	fat, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	// What the bundler lists, less the host entry.
	var listed []string
	for _, l := range strings.Fields(run(t, dir, bundler, "-list", "-type=o", "-input="+out)) {
		if strings.HasPrefix(l, "host-") {
			continue
		}
		tg, err := ParseTarget(l)
		if err != nil {
			t.Errorf("bundler lists %q: %v", l, err)
			continue
		}
		listed = append(listed, tg.Name())
	}
	slices.Sort(listed)
	if !slices.Equal(listed, want) {
		t.Fatalf("bundler lists %v, want %v", listed, want)
	}
	for name, b := range map[string][]byte{
		"bare bundle":  fat,
		"in an ELF":    BuildELF([]byte{0x90}, fat),
		"concatenated": BuildELF([]byte{0x90}, pad(fat, fat)),
	} {
		res, err := Scan(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(res.Names(), want) || res.Unreadable != 0 {
			t.Errorf("%s: %v (%+v), want %v", name, res.Names(), res, want)
		}
	}
}

func TestAgainstClangHIP(t *testing.T) {
	clang := needTool(t, clangHint, "clang-15", "clang")
	lld := needTool(t, clangHint, "ld.lld-15", "ld.lld")
	needTool(t, clangHint, "lld")
	dir := t.TempDir()
	// Enough of the HIP runtime's declarations for clang to emit a
	// kernel launch stub; nothing is linked against them.
	src := `typedef struct { unsigned x, y, z; } dim3;
typedef struct ihipStream_t* hipStream_t;
extern "C" int hipLaunchKernel(const void*, dim3, dim3, void**, unsigned long, hipStream_t);
extern "C" int __hipPushCallConfiguration(dim3, dim3, unsigned long, hipStream_t);
extern "C" int __hipPopCallConfiguration(dim3*, dim3*, unsigned long*, hipStream_t*);
__attribute__((global)) void k(int* p) { *p = 1; }
`
	if err := os.WriteFile(filepath.Join(dir, "k.hip"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"-x", "hip", "-nogpulib", "-nogpuinc", "-fPIC", "-c", "k.hip", "-o", "k.o"}
	want := []string{"gfx1030", "gfx906:xnack-", "gfx90a:sramecc+:xnack-"}
	for _, a := range want {
		args = append(args, "--offload-arch="+a)
	}
	run(t, dir, clang, args...)
	run(t, dir, lld, "-shared", "k.o", "-o", "libk.so")
	for _, f := range []string{"k.o", "libk.so"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		res, err := Scan(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(res.Names(), want) || res.Bundles != 1 || res.Unreadable != 0 {
			t.Errorf("%s: %v (%+v), want %v", f, res.Names(), res, want)
		}
	}
}

// newestLLVMBin returns the bin directory of the newest LLVM installed
// whose clang-offload-bundler can compress (LLVM 18 and later), or "".
func newestLLVMBin() string {
	for v := 30; v >= 18; v-- {
		dir := filepath.Join("/usr/lib/llvm-"+strconv.Itoa(v), "bin")
		b := filepath.Join(dir, "clang-offload-bundler")
		if _, err := os.Stat(b); err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "llc")); err != nil {
			continue
		}
		out, _ := exec.Command(b, "--help").CombinedOutput()
		if strings.Contains(string(out), "--compress") {
			return dir
		}
	}
	return ""
}

func TestAgainstCompressingBundler(t *testing.T) {
	dir := newestLLVMBin()
	if dir == "" {
		t.Skip("no clang-offload-bundler with -compress installed")
	}
	bundler, llc := filepath.Join(dir, "clang-offload-bundler"), filepath.Join(dir, "llc")
	work := t.TempDir()
	if err := os.WriteFile(filepath.Join(work, "k.ll"), []byte(kernelIR), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "host.o"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	type tgt struct{ id, mcpu, mattr, cov string }
	tgts := []tgt{
		{"gfx942:sramecc+:xnack-", "gfx942", "+sramecc,-xnack", ""},
		{"gfx90a:xnack+", "gfx90a", "+xnack", ""},
		{"gfx1100", "gfx1100", "", ""},
		// Generic targets need code object V6.
		{"gfx11-generic", "gfx11-generic", "", "6"},
		{"gfx9-generic:xnack-", "gfx9-generic", "-xnack", "6"},
	}
	targets := []string{"host-x86_64-unknown-linux-gnu"}
	inputs := []string{"-input=host.o"}
	var want []string
	for i, tg := range tgts {
		obj := "k" + string(rune('a'+i)) + ".o"
		args := []string{"-mtriple=amdgcn-amd-amdhsa", "-mcpu=" + tg.mcpu, "-filetype=obj", "k.ll", "-o", obj}
		if tg.mattr != "" {
			args = append(args, "-mattr="+tg.mattr)
		}
		if tg.cov != "" {
			args = append(args, "--amdhsa-code-object-version="+tg.cov)
		}
		cmd := exec.Command(llc, args...)
		cmd.Dir = work
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Logf("llc cannot build %s (%v): %s", tg.id, err, out)
			continue
		}
		co, err := os.ReadFile(filepath.Join(work, obj))
		if err != nil {
			t.Fatal(err)
		}
		res, err := Scan(bytes.NewReader(co), int64(len(co)))
		if err != nil || !res.CodeObject || res.String() != tg.id {
			t.Errorf("llc -mcpu=%s -mattr=%s: %v %v, want %s", tg.mcpu, tg.mattr, res, err, tg.id)
		}
		targets = append(targets, "hipv4-amdgcn-amd-amdhsa--"+tg.id)
		inputs = append(inputs, "-input="+obj)
		want = append(want, tg.id)
	}
	slices.Sort(want)
	// LLVM 20 and later write version 3 when asked.
	for _, env := range []string{"", "COMPRESSED_BUNDLE_FORMAT_VERSION=3"} {
		args := append([]string{"-type=o", "-compress", "-bundle-align=4096", "-targets=" + strings.Join(targets, ","), "-output=z.hipfb"}, inputs...)
		cmd := exec.Command(bundler, args...)
		cmd.Dir = work
		if env != "" {
			cmd.Env = append(os.Environ(), env)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("bundler: %v\n%s", err, out)
		}
		z, err := os.ReadFile(filepath.Join(work, "z.hipfb"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(z, []byte(CompressedMagic)) {
			t.Fatalf("bundler wrote % x, not a compressed bundle", z[:min(len(z), 8)])
		}
		h, check := parseCCOB(z)
		if check != ccobOK || (h.total != uint64(len(z))) {
			t.Errorf("%s: header %+v (%v) for %d bytes", env, h, check, len(z))
		}
		t.Logf("%s: version %d method %d total %d uncompressed %d", env, h.version, h.method, h.total, h.uncompressed)
		for name, b := range map[string][]byte{
			"bare":         z,
			"in an ELF":    BuildELF([]byte{0x90}, z),
			"concatenated": BuildELF([]byte{0x90}, pad(z, z, torchLike())),
		} {
			res, err := Scan(bytes.NewReader(b), int64(len(b)))
			if err != nil {
				t.Fatal(err)
			}
			w := want
			if name == "concatenated" {
				w = slices.Sorted(slices.Values(append(slices.Clone(want), "gfx1100", "gfx90a:xnack-", "gfx942")))
				w = slices.Compact(w)
			}
			if !slices.Equal(res.Names(), w) || res.Unreadable != 0 || res.Compressed == 0 {
				t.Errorf("%s %s: %v (%+v), want %v", env, name, res.Names(), res, w)
			}
		}
	}
}
