package capture

import (
	"bytes"
	"compress/gzip"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/snapshot"
)

// corpusSeeds adds the start of every capture of the corpus, so that the
// fuzzer begins from real formats.
func corpusSeeds(f *testing.F, max int) {
	root := "../testdata/captures"
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Dir(p) == root {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		f.Add(b[:min(len(b), max)])
		return nil
	})
}

// checkSnapshot holds what every importer promises: canonical addresses
// and bounded events.
func checkSnapshot(t *testing.T, s *snapshot.Snapshot) {
	t.Helper()
	canon := func(what, a string) {
		if a == "" {
			return
		}
		if c, err := snapshot.CanonicalPCI(a); err != nil || c != a {
			t.Fatalf("%s address %q is not canonical", what, a)
		}
	}
	for _, g := range s.GPUs {
		canon("GPU", g.PCIAddress)
	}
	for _, e := range s.Events {
		canon("event", e.Device)
		if e.Kind == "" || e.Repeats < 0 {
			t.Fatalf("bad event %+v", e)
		}
	}
	if len(s.Sources) == 0 {
		t.Fatal("a snapshot without a source")
	}
}

// FuzzParseBytes drives every file importer through the dispatcher, with
// cleaning and prefix removal: no input panics, takes a second, or gives a
// snapshot that breaks the importers' promises.
func FuzzParseBytes(f *testing.F) {
	corpusSeeds(f, 4<<10)
	f.Add([]byte("Unable to determine the device handle for GPU 0000:3b:00.0: GPU is lost.  Reboot\n the system to recover this GPU\n"))
	f.Add([]byte("Module                  Size  Used by\nnouveau  1495040  0\nnvidia 13041664 13\nttm 1 1\n"))
	f.Add([]byte("gpu-07: [ 1.0] NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.\ngpu-07: [ 2.0] x\ngpu-07: [ 3.0] y\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		start := time.Now()
		s, err := ParseBytes("fuzz", data)
		if d := time.Since(start); d > time.Second && len(data) < 1<<20 {
			t.Fatalf("ParseBytes took %v on %d bytes", d, len(data))
		}
		if err != nil {
			if s != nil {
				t.Fatal("a snapshot and an error")
			}
			return
		}
		checkSnapshot(t, s)
	})
}

// FuzzReadData drives the bundle readers (nvidia-bug-report sections,
// compressed files, tarballs): no panic, no second-long input.
func FuzzReadData(f *testing.F) {
	b, err := os.ReadFile("../testdata/captures/nvidia-bug-report/rtx2080ti-x4-440.31-xid62-xid13-xid31.log")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b[:16<<10])
	f.Add(tarGz(f, map[string]string{"sos_commands/kernel/dmesg": "[ 1.0] NVRM: Xid (PCI:0000:01:00): 79, x\n", "hostname": "n1\n"}))
	f.Add([]byte("____________________________________________\n\nnvidia-bug-report.sh\n____________________________________________\n\n*** /proc/modules\n*** ls: x\nnouveau 1 0 - Live 0x0\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		start := time.Now()
		parts := readData(context.Background(), "fuzz", data, "")
		if d := time.Since(start); d > time.Second && len(data) < 1<<20 {
			t.Fatalf("readData took %v on %d bytes", d, len(data))
		}
		for _, p := range parts {
			if (p.Err == nil) == (p.Snapshot == nil) {
				t.Fatalf("part %s: want a snapshot or an error, got %v and %v", p.Path, p.Snapshot != nil, p.Err)
			}
			if p.Snapshot != nil {
				checkSnapshot(t, p.Snapshot)
			}
		}
		Machines(parts)
	})
}

// FuzzToolErrors: the failed-tool scanner never panics, and names only
// canonical devices.
func FuzzToolErrors(f *testing.F) {
	for _, s := range []string{"Unable to determine the device handle for GPU 0000:09:00.0: Unknown Error\n", "No devices were found\n",
		"Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 570.124\n", "unable to determine the device handle for gpu 00000000:3B:00.0: GPU is lost"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, e := range scanToolErrors(data, "x") {
			if e.Device != "" {
				if c, err := snapshot.CanonicalPCI(e.Device); err != nil || c != e.Device {
					t.Fatalf("device %q is not canonical", e.Device)
				}
			}
			if len(e.Message) > 1<<16+512 {
				t.Fatalf("message of %d bytes", len(e.Message))
			}
		}
	})
}

// TestBundlesAndFolders: an sosreport tarball, a folder of mixed captures
// and a compressed bug report are each read into their captures, of one
// machine where they are one.
func TestBundlesAndFolders(t *testing.T) {
	read := func(name string) []byte {
		b, err := os.ReadFile("../testdata/captures/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	dir := t.TempDir()
	// An sosreport: the kernel log, lspci and nvidia-smi where sos puts
	// them, the host name, and files that are no capture.
	sos := tarGz(t, map[string]string{
		"sosreport-gpu01-2025/sos_commands/kernel/dmesg":               string(read("dmesg/h100-xid119-gsp-rpc-timeout.log")),
		"sosreport-gpu01-2025/sos_commands/nvidia/nvidia-smi_-q":       string(read("nvidia-smi-q/h100x8-535.183.01-gpu75-slowdown.txt")),
		"sosreport-gpu01-2025/sos_commands/process/ps_auxwww":          "USER PID\nroot 1\n",
		"sosreport-gpu01-2025/sos_commands/kernel/modinfo_ALL_MODULES": "filename: /lib/modules/x/nvidia.ko\n",
		"sosreport-gpu01-2025/hostname":                                "gpu01\n",
		"sosreport-gpu01-2025/etc/os-release":                          "NAME=Debian\n",
	})
	sosPath := filepath.Join(dir, "sosreport-gpu01-2025.tar.gz")
	if err := os.WriteFile(sosPath, sos, 0o644); err != nil {
		t.Fatal(err)
	}
	parts := Read(context.Background(), sosPath)
	kinds := map[string]bool{}
	for _, p := range parts {
		if p.Err != nil {
			t.Fatalf("%s: %v", p.Path, p.Err)
		}
		kinds[p.Kind] = true
		if p.Snapshot.Host.Hostname != "gpu01" {
			t.Errorf("%s: host %q, want gpu01 from the report's hostname file", p.Path, p.Snapshot.Host.Hostname)
		}
	}
	if !kinds["dmesg"] || !kinds["nvidia-smi-q"] || len(parts) != 2 {
		t.Errorf("sosreport gave %d parts of kinds %v, want the kernel log and nvidia-smi -q", len(parts), kinds)
	}
	if ms := Machines(parts); len(ms) != 1 || ms[0].Label != "gpu01" {
		t.Errorf("sosreport: %d machines, want 1 named gpu01", len(ms))
	}

	// A folder of mixed captures of one machine, with a README that is no
	// capture.
	folder := filepath.Join(dir, "node7")
	if err := os.MkdirAll(folder, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, src := range map[string]string{
		"smi.txt":   "nvidia-smi-summary/h100x8-550.90.07.txt",
		"lspci.txt": "lspci/h100-hgx-x8-lspci-vvv.txt",
		"README":    "",
	} {
		b := []byte("notes from the admin\n")
		if src != "" {
			b = read(src)
		}
		if err := os.WriteFile(filepath.Join(folder, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	parts = Read(context.Background(), folder)
	if len(parts) != 2 || parts[0].Err != nil || parts[1].Err != nil {
		t.Fatalf("folder: %d parts (%v)", len(parts), parts)
	}
	if ms := Machines(parts); len(ms) != 1 {
		t.Errorf("folder of one machine: %d machines", len(ms))
	}
	// The same folder with nvidia-smi of another machine (other GPU
	// addresses) holds two.
	if err := os.WriteFile(filepath.Join(folder, "other.txt"), read("nvidia-smi-q/h100x8-535.183.01-gpu75-slowdown.txt"), 0o644); err != nil {
		t.Fatal(err)
	}
	if ms := Machines(Read(context.Background(), folder)); len(ms) != 2 {
		t.Errorf("folder of two machines: %d machines", len(ms))
	}

	// A folder with a KFD topology copy in it beside a kernel log: the
	// copy is read as one capture.
	amd := filepath.Join(dir, "mi210-node")
	if err := os.CopyFS(filepath.Join(amd, "topology"), os.DirFS("../testdata/captures/kfd-topology/mi210-x8-xgmi-pcie")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(amd, "dmesg.txt"), []byte("[ 1.0] amdgpu 0000:03:00.0: amdgpu: ring gfx_0.0.0 timeout\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	parts = Read(context.Background(), amd)
	kinds = map[string]bool{}
	for _, p := range parts {
		kinds[p.Kind] = true
	}
	if len(parts) != 2 || !kinds["kfd-topology"] || !kinds["dmesg"] {
		t.Errorf("folder with a KFD copy: %d parts of kinds %v", len(parts), kinds)
	}

	// nvidia-bug-report.log.gz: gzip of the log, read as the log.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(read("nvidia-bug-report/rtx2080ti-x4-440.31-xid62-xid13-xid31.log"))
	zw.Close()
	gzPath := filepath.Join(dir, "nvidia-bug-report.log.gz")
	if err := os.WriteFile(gzPath, gz.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	parts = Read(context.Background(), gzPath)
	ms := Machines(parts)
	if len(ms) != 1 || len(ms[0].Snapshot.GPUs) != 4 {
		t.Fatalf("bug report: %d machines", len(ms))
	}
	if ms[0].Snapshot.Drivers.NVIDIAKernel != "440.31" {
		t.Errorf("driver %q, want 440.31 from /proc/driver/nvidia/version (the log's older boots ran 430.50)", ms[0].Snapshot.Drivers.NVIDIAKernel)
	}
}

// TestMachinesApart: captures of two machines are not merged; captures of
// one are, and a capture that names no machine joins the only one.
func TestMachinesApart(t *testing.T) {
	parse := func(name string) Part {
		b, err := os.ReadFile("../testdata/captures/" + name)
		if err != nil {
			t.Fatal(err)
		}
		s, err := ParseBytes(name, b)
		if err != nil {
			t.Fatal(err)
		}
		return Part{Path: name, Kind: s.Sources[0].Kind, Snapshot: s}
	}
	smi := parse("nvidia-smi-q/h100x8-535.183.01-gpu75-slowdown.txt") // GPUs 53..ca
	xid := parse("dmesg/h100-xid119-gsp-rpc-timeout.log")             // Xid on 9b
	topo := parse("nvidia-smi-topo/b300x8-cx8-bond-topo-m.txt")       // names no address
	lspci := parse("lspci/h100-hgx-x8-lspci-vvv.txt")                 // GPUs 19..db
	sum := parse("nvidia-smi-summary/h100x8-550.90.07.txt")           // GPUs 19..db
	if ms := Machines([]Part{smi, xid}); len(ms) != 2 {
		t.Errorf("nvidia-smi of one machine and an Xid on another: %d machines, want 2", len(ms))
	}
	if ms := Machines([]Part{lspci, sum, topo}); len(ms) != 1 {
		t.Errorf("lspci and nvidia-smi with the same GPU addresses, and a matrix: %d machines, want 1", len(ms))
	}
	ms := Machines([]Part{smi, lspci, topo})
	if len(ms) != 3 || ms[2].Label != "inputs that name no machine" {
		t.Errorf("two machines and a matrix: %d machines (%v), want 3 with the matrix apart", len(ms), ms)
	}
	// Two names are two machines even where addresses agree.
	a, b := parse("lspci/h100-hgx-x8-lspci-vvv.txt"), parse("nvidia-smi-summary/h100x8-550.90.07.txt")
	a.Snapshot.Host.Hostname, b.Snapshot.Host.Hostname = "gpu-a", "gpu-b"
	if ms := Machines([]Part{a, b}); len(ms) != 2 {
		t.Errorf("same addresses, two host names: %d machines, want 2", len(ms))
	}
}

// TestToolErrorsNonASCII: a message whose lower case is longer than itself
// ("İ" lowers to three bytes) must not shift the text the scanner cuts.
func TestToolErrorsNonASCII(t *testing.T) {
	line := strings.Repeat("İ", 100) + " Unable to determine the device handle for GPU 0000:3b:00.0: GPU is lost\n"
	evs := scanToolErrors([]byte(line), "x")
	if len(evs) != 1 || evs[0].Device != "0000:3b:00.0" || !strings.HasPrefix(evs[0].Message, "Unable to determine") {
		t.Errorf("events %+v", evs)
	}
}
