package pkgdb

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// fuzzPaths are the formats FuzzRead feeds; the first byte of an input
// picks one.
var fuzzPaths = []string{
	"var/lib/dpkg/status",
	"var/lib/dpkg/status.d/libc6",
	"lib/apk/db/installed",
	"usr/local/cuda-12.4/version.json",
	"usr/local/cuda-10.2/version.txt",
	"opt/rocm-6.2.0/.info/version",
	"etc/os-release",
	"var/lib/rpm/rpmdb.sqlite",
}

var driverRe = regexp.MustCompile(`^\d{3,4}\.\d{1,3}(\.\d{1,3})?$`)

// checkFacts asserts what must hold of any Facts: every CUDA or ROCm
// version is a release (2 or 3 numeric fields, major 1-99, minor and
// patch 0-99: no build id), every From says where it comes from, and
// compat drivers look like NVIDIA driver versions.
func checkFacts(t *testing.T, f Facts) {
	t.Helper()
	for _, list := range [][]Version{f.CUDA, f.ROCm} {
		for _, v := range list {
			ns, ok := numFields(v.Version)
			if !ok || !releaseOK(ns) {
				t.Fatalf("version %q is not a release (from %q)", v.Version, v.From)
			}
			if join(ns) != v.Version {
				t.Fatalf("version %q is not canonical", v.Version)
			}
			if v.From == "" {
				t.Fatalf("version %q without From", v.Version)
			}
		}
	}
	for _, v := range f.CompatDriver {
		if !driverRe.MatchString(v.Version) || v.From == "" {
			t.Fatalf("compat driver %+v", v)
		}
	}
	for _, p := range f.Packages {
		if p.Name == "" || p.Version == "" || (p.Source != SourceDpkg && p.Source != SourceApk && p.Source != SourceRPM) {
			t.Fatalf("package %+v", p)
		}
	}
}

func FuzzRead(f *testing.F) {
	add := func(path string, body []byte) {
		for i, p := range fuzzPaths {
			if p == path {
				f.Add(byte(i), body)
				return
			}
		}
		f.Fatalf("no fuzz path %s", path)
	}
	bookworm, err := os.ReadFile(filepath.Join("testdata", "dpkg-status-bookworm"))
	if err != nil {
		f.Fatal(err)
	}
	add("var/lib/dpkg/status", bookworm)
	add("var/lib/dpkg/status", []byte(nvidiaCUDAStatus))
	add("var/lib/dpkg/status", []byte(strings.ReplaceAll(nvidiaCUDAStatus, "\n", "\r\n")))
	add("var/lib/dpkg/status", []byte("Package: rocm-core\nStatus: install ok installed\nVersion: 6.2.0.60200-66~22.04\n\nPackage: hip-runtime-amd\nStatus: hold ok installed\nVersion: 6.2.41133.60200-66~22.04\n"))
	add("var/lib/dpkg/status.d/libc6", []byte("Package: libamdhip64-5\nVersion: 5.2.3-8\n"))
	add("lib/apk/db/installed", []byte(apkInstalled))
	add("usr/local/cuda-12.4/version.json", []byte(`{"cuda":{"name":"CUDA SDK","version":"12.4.1"},"cuda_cudart":{"name":"CUDA Runtime (cudart)","version":"12.4.127"}}`))
	add("usr/local/cuda-12.4/version.json", []byte(`{"cuda":{"name":"CUDA SDK","version":"11.8.20220929"}}`))
	add("usr/local/cuda-10.2/version.txt", []byte("CUDA Version 10.2.89\n"))
	add("opt/rocm-6.2.0/.info/version", []byte("6.2.0-66\n"))
	add("etc/os-release", []byte("ID=ubuntu\nVERSION_ID=\"22.04\"\n"))
	db := rpmDB(f)
	add("var/lib/rpm/rpmdb.sqlite", db)
	add("var/lib/rpm/rpmdb.sqlite", db[:4096])
	f.Fuzz(func(t *testing.T, which byte, body []byte) {
		p := fuzzPaths[int(which)%len(fuzzPaths)]
		if p == "var/lib/rpm/rpmdb.sqlite" && len(body) > 1<<20 {
			return
		}
		facts, err := Read(p, bytes.NewReader(body))
		if err != nil {
			return
		}
		checkFacts(t, facts)
	})
}

// FuzzRPMHeader feeds arbitrary blobs to the header parser: it must not
// panic or read out of bounds.
func FuzzRPMHeader(f *testing.F) {
	f.Add(firstBlob(f))
	f.Add(synthHeader(map[uint32]any{1000: "cuda-nvrtc-11-8", 1001: "11.8.89", 1002: "1", 1003: uint32(2)}))
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		pk, err := parseRPMHeader(b)
		if err == nil && (pk.Name == "" || pk.Version == "" || pk.Source != SourceRPM) {
			t.Fatalf("parsed %+v", pk)
		}
	})
}

// FuzzFromPackages feeds arbitrary package names and versions to the
// rules: whatever they derive must be a release, never a build id.
func FuzzFromPackages(f *testing.F) {
	for _, c := range packageCases {
		f.Add(c.pk.Name, c.pk.Version, c.pk.Source)
	}
	f.Fuzz(func(t *testing.T, name, version, source string) {
		if name == "" || version == "" {
			return
		}
		pk := []Package{{Name: name, Version: version, Source: source}}
		cuda, rocm := FromPackages(pk)
		fs := Facts{CUDA: cuda, ROCm: rocm, CompatDriver: CompatDrivers(pk)}
		checkFacts(t, fs)
	})
}

var majorMinorRe = regexp.MustCompile(`^[1-9][0-9]?\.(0|[1-9][0-9]?)$`)

func FuzzHIPSoname(f *testing.F) {
	for _, s := range []string{"5.2.21153", "6.2.41133", "6.4.60400", "5", "", "6.100.1", "6.2.1.1", "99.99.99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, ok := HIPSoname(s)
		if ok != (v != "") {
			t.Fatalf("HIPSoname(%q) = %q, %v", s, v, ok)
		}
		if ok && !majorMinorRe.MatchString(v) {
			t.Fatalf("HIPSoname(%q) = %q: not major.minor", s, v)
		}
	})
}

func FuzzROCmInfoVersion(f *testing.F) {
	for _, s := range []string{"6.2.0-66\n", "5.7.1", "junk", "", "6.2.41133-66", "6.2.0.60200-66", "  6.4.2-120\r\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ROCmInfoVersion(s)
		if err != nil {
			if v != "" {
				t.Fatalf("ROCmInfoVersion(%q) = %q with error %v", s, v, err)
			}
			return
		}
		ns, ok := numFields(v)
		if !ok || !releaseOK(ns) || join(ns) != v {
			t.Fatalf("ROCmInfoVersion(%q) = %q: not a release", s, v)
		}
	})
}
