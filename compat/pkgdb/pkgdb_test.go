package pkgdb

import (
	"bytes"
	"compress/gzip"
	"database/sql"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestWants(t *testing.T) {
	for p, want := range map[string]bool{
		"var/lib/dpkg/status":                        true,
		"/var/lib/dpkg/status":                       true,
		"var/lib/dpkg/status-old":                    false,
		"var/lib/dpkg/status.d/libc6":                true,
		"var/lib/dpkg/status.d/libc6.md5sums":        false,
		"var/lib/dpkg/status.d/":                     false,
		"var/lib/dpkg/status.d/sub/x":                false,
		"lib/apk/db/installed":                       true,
		"lib/apk/db/triggers":                        false,
		"var/lib/rpm/rpmdb.sqlite":                   true,
		"usr/lib/sysimage/rpm/rpmdb.sqlite":          true,
		"var/lib/rpm/rpmdb.sqlite-wal":               false,
		"var/lib/rpm/Packages":                       false,
		"usr/local/cuda-12.4/version.json":           true,
		"usr/local/cuda/version.json":                true,
		"usr/local/cuda-10.2/version.txt":            true,
		"usr/local/cuda-12.4/targets/version.json":   false,
		"usr/local/cudnn/version.json":               false,
		"opt/rocm-6.2.0/.info/version":               true,
		"opt/rocm/.info/version-dev":                 true,
		"opt/rocm-6.2.0/share/doc/rocm-core/README":  false,
		"opt/rocm-6.2.0/.info/sub/version":           false,
		"etc/os-release":                             true,
		"usr/lib/os-release":                         true,
		"etc/lsb-release":                            false,
		"usr/local/lib/python3.10/version.json":      false,
		"":                                           false,
		"var/lib/dpkg/status.d/base-files.md5sums":   false,
		"var/lib/dpkg/status.d/libssl3":              true,
		"opt/rocm-6.2.0/lib/libamdhip64.so.6.2.6020": false,
	} {
		if got := Wants(p); got != want {
			t.Errorf("Wants(%q) = %v, want %v", p, got, want)
		}
	}
}

func TestMaxBytes(t *testing.T) {
	for p, want := range map[string]int64{
		"var/lib/dpkg/status":              16 << 20,
		"lib/apk/db/installed":             16 << 20,
		"var/lib/rpm/rpmdb.sqlite":         64 << 20,
		"var/lib/dpkg/status.d/libc6":      64 << 10,
		"usr/local/cuda-12.4/version.json": 64 << 10,
		"etc/os-release":                   64 << 10,
		"bin/sh":                           0,
	} {
		if got := MaxBytes(p); got != want {
			t.Errorf("MaxBytes(%q) = %d, want %d", p, got, want)
		}
	}
}

func read(t *testing.T, p, body string) Facts {
	t.Helper()
	f, err := Read(p, strings.NewReader(body))
	if err != nil {
		t.Fatalf("Read(%q): %v", p, err)
	}
	return f
}

func eq(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got  %#v\n want %#v", what, got, want)
	}
}

// nvidiaCUDAStatus is shaped like the dpkg status of
// nvidia/cuda:12.4.1-runtime-ubuntu22.04: the versions are those its
// Dockerfiles pin (NV_CUDA_CUDART_VERSION 12.4.127-1, NV_CUDA_LIB_VERSION
// 12.4.1-1, NV_NVTX_VERSION 12.4.127-1, NV_LIBCUBLAS_VERSION 12.4.5.8-1,
// NV_LIBNCCL_PACKAGE_VERSION 2.21.5-1 for cuda12.4), cuda-compat-12-4 is
// 550.54.15-1, and libcublas / libnccl2 are "apt-mark hold"-ed as the
// Dockerfiles do.
const nvidiaCUDAStatus = `Package: cuda-cudart-12-4
Status: install ok installed
Priority: optional
Section: devel
Installed-Size: 756
Maintainer: cudatools <cudatools@nvidia.com>
Architecture: amd64
Version: 12.4.127-1
Depends: cuda-toolkit-12-4-config-common, cuda-toolkit-12-config-common, cuda-toolkit-config-common
Description: CUDA Runtime native Libraries
 CUDA Runtime native Libraries
 Package: not-a-package
 Version: 9.9.9

Package: cuda-compat-12-4
Status: install ok installed
Architecture: amd64
Version: 550.54.15-1
Description: CUDA Compatibility Platform

Package: cuda-libraries-12-4
Status: install ok installed
Architecture: amd64
Version: 12.4.1-1
Description: CUDA Libraries 12.4 meta-package

Package: cuda-nvtx-12-4
Status: install ok installed
Architecture: amd64
Version: 12.4.127-1
Description: NVIDIA Tools Extension

Package: libcublas-12-4
Status: hold ok installed
Architecture: amd64
Version: 12.4.5.8-1
Description: CUBLAS native runtime libraries

Package: libnccl2
Status: hold ok installed
Architecture: amd64
Version: 2.21.5-1+cuda12.4
Description: NVIDIA Collective Communication Library (NCCL) Runtime

Package: cuda-cudart-12-3
Status: deinstall ok config-files
Architecture: amd64
Version: 12.3.101-1

Package: cuda-nvrtc-12-4
Status: install ok half-installed
Architecture: amd64
Version: 12.4.127-1

Package: cuda-toolkit-config-common
Status: install ok installed
Architecture: all
Version: 12.4.127-1
`

func TestReadDpkgNVIDIA(t *testing.T) {
	for name, body := range map[string]string{
		"lf":   nvidiaCUDAStatus,
		"crlf": strings.ReplaceAll(nvidiaCUDAStatus, "\n", "\r\n"),
		// whitespace-only separators and no final newline
		"ws": strings.TrimSuffix(strings.ReplaceAll(nvidiaCUDAStatus, "\n\n", "\n \t\n"), "\n"),
	} {
		t.Run(name, func(t *testing.T) {
			f := read(t, "var/lib/dpkg/status", body)
			eq(t, "packages", f.Packages, []Package{
				{"cuda-cudart-12-4", "12.4.127-1", "dpkg"},
				{"cuda-compat-12-4", "550.54.15-1", "dpkg"},
				{"cuda-libraries-12-4", "12.4.1-1", "dpkg"},
				{"cuda-nvtx-12-4", "12.4.127-1", "dpkg"},
				{"libcublas-12-4", "12.4.5.8-1", "dpkg"},
				{"libnccl2", "2.21.5-1+cuda12.4", "dpkg"},
				{"cuda-toolkit-config-common", "12.4.127-1", "dpkg"},
			})
			eq(t, "cuda", f.CUDA, []Version{{"12.4.1", "dpkg: cuda-libraries-12-4 12.4.1-1"}})
			eq(t, "compat", f.CompatDriver, []Version{{"550.54.15", "dpkg: cuda-compat-12-4 550.54.15-1 (CUDA 12.4 forward-compatibility driver 550.54.15)"}})
			eq(t, "rocm", f.ROCm, []Version(nil))
		})
	}
}

// testdata/dpkg-status-bookworm holds Debian 12 stanzas as the archive
// has them (apt-cache show, with the Status line dpkg adds), libc6's as
// a bookworm system's status file has it.
func TestReadDpkgBookworm(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "dpkg-status-bookworm"))
	if err != nil {
		t.Fatal(err)
	}
	f := read(t, "var/lib/dpkg/status", string(b))
	eq(t, "packages", f.Packages, []Package{
		{"libc6", "2.36-9+deb12u14", "dpkg"},
		{"libamdhip64-5", "5.2.3-8", "dpkg"},
		{"libhsa-runtime64-1", "5.2.3-3", "dpkg"},
		{"librocsparse0", "5.3.0+dfsg-2", "dpkg"},
		{"libcudart11.0", "11.8.89~11.8.0-5~deb12u1", "dpkg"},
	})
	eq(t, "rocm", f.ROCm, []Version{
		{"5.2", "dpkg: libamdhip64-5 5.2.3-8 (distribution build of HIP 5.2 = ROCm 5.2)"},
		{"5.3", "dpkg: librocsparse0 5.3.0+dfsg-2 (distribution build tagged rocm-5.3.0 = ROCm 5.3, not the library's own version)"},
	})
	eq(t, "cuda", f.CUDA, []Version{
		{"11.8.0", "dpkg: libcudart11.0 11.8.89~11.8.0-5~deb12u1 (distribution build of CUDA 11.8.0, the part after \"~\")"},
	})
}

// A distroless image (gcr.io/distroless/base-debian12) writes one stanza
// per package in var/lib/dpkg/status.d/, without a Status line.
func TestReadDpkgStatusD(t *testing.T) {
	f := read(t, "var/lib/dpkg/status.d/libc6", "Package: libc6\nVersion: 2.36-9+deb12u14\nArchitecture: amd64\nSource: glibc\n")
	eq(t, "packages", f.Packages, []Package{{"libc6", "2.36-9+deb12u14", "dpkg"}})
	// A Status line, where present, still counts.
	f = read(t, "var/lib/dpkg/status.d/x", "Package: x\nStatus: deinstall ok config-files\nVersion: 1\n")
	eq(t, "config-files", f.Packages, []Package(nil))
	// The full status file needs one.
	f = read(t, "var/lib/dpkg/status", "Package: libc6\nVersion: 2.36-9+deb12u14\n")
	eq(t, "no status", f.Packages, []Package(nil))
}

// The apk installed database as apk-tools writes it: C (checksum), P, V,
// A, S, I, T, U, L, o, m, t, c, D, p, then the file list (F, R, a, Z).
const apkInstalled = `C:Q1Deb0jNytkrjPW4N/eKLZ43BwOlw=
P:musl
V:1.2.2-r7
A:x86_64
S:383152
I:622592
T:the musl c library (libc) implementation
U:https://musl.libc.org/
L:MIT
o:musl
m:Timo Teräs <timo.teras@iki.fi>
t:1632431095
c:bf5bbfdbf780092f387b7abe401fbfceda90c84d
p:so:libc.musl-x86_64.so.1=1
F:lib
R:ld-musl-x86_64.so.1
a:0:0:755
Z:Q12adwqQOjo9dFl+VJD2Ecd901vhE=
R:libc.musl-x86_64.so.1
a:0:0:777

C:Q1Kja2+POZKxEkUOZqwSjC6kmaED4=
P:busybox
V:1.34.1-r3
A:x86_64
T:Size optimized toolbox of many common UNIX utilities
P:ssl_client
V:1.34.1-r3
A:x86_64

P:broken-no-version
A:x86_64
`

func TestReadApk(t *testing.T) {
	for name, body := range map[string]string{"lf": apkInstalled, "crlf": strings.ReplaceAll(apkInstalled, "\n", "\r\n")} {
		t.Run(name, func(t *testing.T) {
			f := read(t, "lib/apk/db/installed", body)
			eq(t, "packages", f.Packages, []Package{
				{"musl", "1.2.2-r7", "apk"},
				{"busybox", "1.34.1-r3", "apk"},
				{"ssl_client", "1.34.1-r3", "apk"},
			})
			if f.CUDA != nil || f.ROCm != nil {
				t.Errorf("apk facts: %+v", f)
			}
		})
	}
}

func rpmDB(t testing.TB) []byte {
	t.Helper()
	gz, err := os.Open(filepath.Join("testdata", "rpmdb.sqlite.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer gz.Close()
	zr, err := gzip.NewReader(gz)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testdata/rpmdb.sqlite.gz is a database made by rpm 4.18 itself (see
// testdata/mkrpmdb.sh), in WAL mode as rpm leaves it, with packages
// named and versioned as on RHEL 9: NVIDIA's rhel9 repository
// (cuda-cudart-12-4-12.4.127-1, cuda-compat-12-4-550.54.15-1), AMD's
// (amd-smi-lib 24.6.2.60200-66.el9 and amdgpu-core 1:6.2.60200-2009582.el9
// from a "yum list installed" of ROCm 6.2 on RHEL 9.4; rocm-core with
// the same release), and zlib.
func TestReadRPM(t *testing.T) {
	db := rpmDB(t)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	defer func() {
		// The database's temporary copy is gone.
		if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
			t.Errorf("left in TMPDIR: %v", ents)
		}
	}()
	for _, p := range []string{"var/lib/rpm/rpmdb.sqlite", "usr/lib/sysimage/rpm/rpmdb.sqlite"} {
		f, err := Read(p, bytes.NewReader(db))
		if err != nil {
			t.Fatalf("Read(%s): %v", p, err)
		}
		eq(t, "packages", f.Packages, []Package{
			{"zlib", "1.2.11-40.el9", "rpm"},
			{"rocm-core", "6.2.0.60200-66.el9", "rpm"},
			{"cuda-cudart-12-4", "12.4.127-1", "rpm"},
			{"cuda-compat-12-4", "550.54.15-1", "rpm"},
			{"amdgpu-core", "1:6.2.60200-2009582.el9", "rpm"},
			{"amd-smi-lib", "24.6.2.60200-66.el9", "rpm"},
		})
		eq(t, "cuda", f.CUDA, []Version{{"12.4", "rpm: cuda-cudart-12-4 12.4.127-1 (CUDA 12.4 from the name; runtime 12.4.127)"}})
		eq(t, "rocm", f.ROCm, []Version{{"6.2.0", "rpm: rocm-core 6.2.0.60200-66.el9"}})
		eq(t, "compat", f.CompatDriver, []Version{{"550.54.15", "rpm: cuda-compat-12-4 550.54.15-1 (CUDA 12.4 forward-compatibility driver 550.54.15)"}})
	}
}

func TestReadRPMBad(t *testing.T) {
	db := rpmDB(t)
	for name, body := range map[string][]byte{
		"empty":     nil,
		"text":      []byte("Package: x\nVersion: 1\n"),
		"truncated": db[:len(db)/2],
		"header":    append([]byte("SQLite format 3\x00"), make([]byte, 200)...),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Read("var/lib/rpm/rpmdb.sqlite", bytes.NewReader(body))
			if err == nil {
				t.Fatal("no error")
			}
		})
	}
	// An SQLite file without a Packages table.
	_, err := Read("var/lib/rpm/rpmdb.sqlite", bytes.NewReader(emptySQLite(t)))
	if !errors.Is(err, ErrMalformed) {
		t.Errorf("no Packages table: %v", err)
	}
}

// emptySQLite is a valid SQLite file with one unrelated table.
func emptySQLite(t *testing.T) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "x.sqlite")
	db, err := sql.Open("sqlite", "file:"+p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE Other (x INTEGER)"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	out, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestRPMHeader(t *testing.T) {
	// The first header of the real database, as rpm exported it.
	good := firstBlob(t)
	pk, err := parseRPMHeader(good)
	if err != nil || pk != (Package{"zlib", "1.2.11-40.el9", "rpm"}) {
		t.Fatalf("parseRPMHeader = %+v, %v", pk, err)
	}
	// The same with the 8-byte magic of an rpm file's header in front.
	withMagic := append([]byte{0x8e, 0xad, 0xe8, 0x01, 0, 0, 0, 0}, good...)
	if pk2, err := parseRPMHeader(withMagic); err != nil || pk2 != pk {
		t.Errorf("with magic: %+v, %v", pk2, err)
	}
	// A synthetic header: NAME, VERSION, RELEASE, EPOCH.
	syn := synthHeader(map[uint32]any{1000: "cuda-nvrtc-11-8", 1001: "11.8.89", 1002: "1", 1003: uint32(0)})
	if pk, err := parseRPMHeader(syn); err != nil || pk != (Package{"cuda-nvrtc-11-8", "11.8.89-1", "rpm"}) {
		t.Errorf("synthetic: %+v, %v", pk, err)
	}
	syn = synthHeader(map[uint32]any{1000: "shadow-utils", 1001: "4.9", 1002: "8.el9", 1003: uint32(2)})
	if pk, err := parseRPMHeader(syn); err != nil || pk.Version != "2:4.9-8.el9" {
		t.Errorf("epoch: %+v, %v", pk, err)
	}
	for name, b := range map[string][]byte{
		"short":        good[:7],
		"cut":          good[:len(good)-1],
		"no entries":   {0, 0, 0, 0, 0, 0, 0, 0},
		"huge il":      {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0},
		"no name":      synthHeader(map[uint32]any{1001: "1"}),
		"string oob":   corruptOffset(synthHeader(map[uint32]any{1000: "x", 1001: "1"}), 0, 1<<20),
		"epoch oob":    corruptOffset(synthHeader(map[uint32]any{1000: "x", 1001: "1", 1003: uint32(1)}), 2, 1<<30),
		"unterminated": unterminated(synthHeader(map[uint32]any{1000: "x", 1001: "1"})),
	} {
		if pk, err := parseRPMHeader(b); err == nil {
			t.Errorf("%s: no error (%+v)", name, pk)
		}
	}
}

func TestReadROCmInfo(t *testing.T) {
	f := read(t, "opt/rocm-6.2.0/.info/version", "6.2.0-66\n")
	eq(t, "rocm", f.ROCm, []Version{{"6.2.0", "opt/rocm-6.2.0/.info/version"}})
	if _, err := Read("opt/rocm/.info/version", strings.NewReader("garbage\n")); !errors.Is(err, ErrMalformed) {
		t.Errorf("junk: %v", err)
	}
}

func TestReadCUDAVersionFiles(t *testing.T) {
	for _, c := range []struct {
		path, body string
		want       []Version
	}{
		// deb/rpm install in nvidia/cuda:12.4.1 images: "cuda" is the
		// release, cuda_cudart the runtime (12.4.127, NV_CUDA_CUDART_VERSION).
		{"usr/local/cuda-12.4/version.json", `{
   "cuda" : {
      "name" : "CUDA SDK",
      "version" : "12.4.1"
   },
   "cuda_cudart" : {
      "name" : "CUDA Runtime (cudart)",
      "version" : "12.4.127"
   }
}
`, []Version{{"12.4.1", "usr/local/cuda-12.4/version.json"}}},
		// An 11.5.2 install (published "cat /usr/local/cuda-11.5/version.json").
		{"usr/local/cuda-11.5/version.json", `{"cuda":{"name":"CUDA SDK","version":"11.5.2"},"cuda_cudart":{"name":"CUDA Runtime (cudart)","version":"11.5.117"}}`,
			[]Version{{"11.5.2", "usr/local/cuda-11.5/version.json"}}},
		// The 11.8 runfile writes a build date as the third field.
		{"usr/local/cuda/version.json", `{"cuda":{"name":"CUDA SDK","version":"11.8.20220929"},"nvidia_driver":{"name":"NVIDIA Linux Driver","version":"520.61.05"}}`,
			[]Version{{"11.8", "usr/local/cuda/version.json (11.8.20220929: 20220929 is a build number, not an update release)"}}},
		// Jetson (L4T) CUDA 12.2.
		{"usr/local/cuda-12.2/version.json", `{ "cuda" : { "name" : "CUDA SDK", "version" : "12.2.140" } }`,
			[]Version{{"12.2", "usr/local/cuda-12.2/version.json (12.2.140: 140 is a build number, not an update release)"}}},
		// No "cuda" entry: no fact.
		{"usr/local/cuda/version.json", `{"cuda_nvcc":{"name":"CUDA NVCC","version":"11.8.89"}}`, nil},
		// CUDA 10.2's version.txt.
		{"usr/local/cuda-10.2/version.txt", "CUDA Version 10.2.89\n",
			[]Version{{"10.2", "usr/local/cuda-10.2/version.txt (CUDA Version 10.2.89; 89 is a build number)"}}},
		{"usr/local/cuda/version.txt", "CUDA Version 9.0.176\r\n",
			[]Version{{"9.0", "usr/local/cuda/version.txt (CUDA Version 9.0.176; 176 is a build number)"}}},
	} {
		f := read(t, c.path, c.body)
		eq(t, c.path+" "+c.body[:min(len(c.body), 30)], f.CUDA, c.want)
	}
	for _, c := range []struct{ path, body string }{
		{"usr/local/cuda/version.json", `{"cuda":`},
		{"usr/local/cuda/version.json", `{"cuda":{"version":"12.41133.1"}}`},
		{"usr/local/cuda/version.json", `{"cuda":{"version":12}}`},
		{"usr/local/cuda/version.json", `[]`},
		{"usr/local/cuda/version.txt", "CUDA 12\n"},
		{"usr/local/cuda/version.txt", "CUDA Version 10.200.89\n"},
	} {
		if _, err := Read(c.path, strings.NewReader(c.body)); !errors.Is(err, ErrMalformed) {
			t.Errorf("Read(%s, %q) = %v, want ErrMalformed", c.path, c.body, err)
		}
	}
}

func TestReadOSRelease(t *testing.T) {
	for body, want := range map[string]string{
		// ubuntu:22.04
		"PRETTY_NAME=\"Ubuntu 22.04.4 LTS\"\nNAME=\"Ubuntu\"\nVERSION_ID=\"22.04\"\nVERSION=\"22.04.4 LTS (Jammy Jellyfish)\"\nVERSION_CODENAME=jammy\nID=ubuntu\nID_LIKE=debian\n": "ubuntu 22.04",
		// debian:12
		"PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\nVERSION_ID=\"12\"\nVERSION=\"12 (bookworm)\"\nVERSION_CODENAME=bookworm\nID=debian\n": "debian 12",
		// alpine:3.20, CRLF
		"NAME=\"Alpine Linux\"\r\nID=alpine\r\nVERSION_ID=3.20.3\r\n": "alpine 3.20.3",
		// rockylinux:9, single quotes
		"NAME='Rocky Linux'\nID='rocky'\nVERSION_ID='9.4'\n": "rocky 9.4",
		// Debian sid has no VERSION_ID.
		"PRETTY_NAME=\"Debian GNU/Linux trixie/sid\"\nID=debian\n": "debian",
		"# comment\nVERSION_ID=1\n":                                "",
		"ID=\"bad id\"\nVERSION_ID=1\n":                            "",
		"ID=ok\nVERSION_ID=\"1 2\"\n":                              "ok",
	} {
		if got := read(t, "etc/os-release", body).OS; got != want {
			t.Errorf("os-release %q: %q, want %q", body, got, want)
		}
	}
}

func TestReadLimits(t *testing.T) {
	if _, err := Read("bin/sh", strings.NewReader("")); !errors.Is(err, ErrNotWanted) {
		t.Errorf("unwanted path: %v", err)
	}
	big := strings.Repeat("x", 64<<10+1)
	if _, err := Read("etc/os-release", strings.NewReader(big)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("too large: %v", err)
	}
	if _, err := Read("etc/os-release", strings.NewReader(big[:64<<10])); err != nil {
		t.Errorf("at the limit: %v", err)
	}
	if _, err := Read("var/lib/rpm/rpmdb.sqlite", io.LimitReader(zeros{}, 64<<20+1)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("rpm too large: %v", err)
	}
	if _, err := Read("etc/os-release", errReader{}); err == nil || errors.Is(err, ErrMalformed) {
		t.Errorf("reader error: %v", err)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("boom") }

func TestMerge(t *testing.T) {
	var f Facts
	f.Merge(read(t, "usr/lib/os-release", "ID=ubuntu\nVERSION_ID=\"22.04\"\n"))
	f.Merge(read(t, "var/lib/dpkg/status", nvidiaCUDAStatus))
	f.Merge(read(t, "usr/local/cuda-12.4/version.json", `{"cuda":{"name":"CUDA SDK","version":"12.4.1"}}`))
	f.Merge(read(t, "usr/local/cuda-12.4/version.json", `{"cuda":{"name":"CUDA SDK","version":"12.4.1"}}`))
	f.Merge(read(t, "opt/rocm/.info/version", "6.2.0-66"))
	f.Merge(read(t, "etc/os-release", "ID=\n"))
	if f.OS != "ubuntu 22.04" {
		t.Errorf("OS %q", f.OS)
	}
	if len(f.Packages) != 7 {
		t.Errorf("%d packages", len(f.Packages))
	}
	eq(t, "cuda", f.CUDA, []Version{
		{"12.4.1", "dpkg: cuda-libraries-12-4 12.4.1-1"},
		{"12.4.1", "usr/local/cuda-12.4/version.json"},
	})
	eq(t, "rocm", f.ROCm, []Version{{"6.2.0", "opt/rocm/.info/version"}})
	eq(t, "compat", len(f.CompatDriver), 1)
	f.Merge(read(t, "etc/os-release", "ID=debian\nVERSION_ID=12\n"))
	if f.OS != "debian 12" {
		t.Errorf("OS after upper layer %q", f.OS)
	}
}
