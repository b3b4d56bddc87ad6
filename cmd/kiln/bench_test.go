package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/doctor"
	"kiln.dev/kiln/gpubench"
	"kiln.dev/kiln/gpubench/benchtest"
	"kiln.dev/kiln/snapshot"
)

// emptyRoot is a machine with a PCI bus and no GPU.
func emptyRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "sys/bus/pci/devices"), 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestBenchNoGPU is this machine's case: no GPU and no driver library.
// kiln bench says so, names what it tried, and exits 3.
func TestBenchNoGPU(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libcuda.so.1")
	out, stderr, code := kiln(t, "bench", "--root", emptyRoot(t), "--no-nvml", "--kernel-log", os.DevNull,
		"--cuda-lib", missing, "--hip-lib", filepath.Join(t.TempDir(), "libamdhip64.so"))
	if code != benchExitCannot {
		t.Fatalf("exit %d, want %d; stdout %s stderr %s", code, benchExitCannot, out, stderr)
	}
	for _, want := range []string{"no GPU to measure on this machine", "PCI bus: no GPU", "cuda: cannot load the CUDA driver (is the NVIDIA driver installed?)",
		"hip: cannot load HIP (is ROCm installed?)", "--from"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("message lacks %q:\n%s", want, stderr)
		}
	}
	if len(out) != 0 {
		t.Errorf("stdout: %s", out)
	}
	// The same on the loader's own search: where this machine has no
	// driver libraries (the test setup's case) it must say so too.
	_, stderr, code = kiln(t, "bench", "--root", emptyRoot(t), "--no-nvml", "--kernel-log", os.DevNull, "--driver", "cuda")
	if code == benchExitCannot && !strings.Contains(stderr, "libcuda.so.1") {
		t.Errorf("default library: %s", stderr)
	}
}

// fixtureGPUs are the PCIe Gen4 fixture's L40S cards: two under a switch
// on NUMA node 0 (0000:41:00.0 trained at x8), two on node 1.
var fixtureGPUs = []string{"0000:41:00.0", "0000:42:00.0", "0000:c1:00.0", "0000:c2:00.0"}

// fakeBench replaces the driver libraries with fakes for the fixture's
// GPUs: host copies at 26 GB/s (12 for the x8 card), pageable at 10, within
// a card 400 (800 read+write), between cards of one switch 25, across the
// sockets 8; collectives at 20 GB/s of algorithm bandwidth.
func fakeBench(t *testing.T, fail func(string, ...any) error) *benchtest.Driver {
	t.Helper()
	d := benchtest.New(4, 0, 1)
	for i, a := range fixtureGPUs {
		d.Devs[i].PCI = a
	}
	d.Fail = fail
	d.Rate = func(c benchtest.Copy) float64 {
		src, dst := c.Src, c.Dst
		switch {
		case src.Kind == gpubench.HostPageable || dst.Kind == gpubench.HostPageable:
			return 10
		case src.Kind != gpubench.DeviceMemory || dst.Kind != gpubench.DeviceMemory:
			if c.Stream.Device == 0 {
				return 12
			}
			return 26
		case src.Device == dst.Device:
			return 400
		case src.Device/2 == dst.Device/2:
			return 25
		}
		return 8
	}
	coll := &benchtest.Collectives{Driver: d, Time: func(_ gpubench.Op, bytes int64, _ int) time.Duration {
		return time.Duration(float64(bytes) / 20)
	}}
	old := openBenchLibs
	openBenchLibs = func(f *benchFlags, s *snapshot.Snapshot, wantCollectives bool) (*benchLibs, error) {
		return &benchLibs{driver: d, collectives: coll}, nil
	}
	t.Cleanup(func() { openBenchLibs = old })
	return d
}

func fixtureArgs(extra ...string) []string {
	return append([]string{"bench", "--root", fxPCIe4 + "/sysfs", "--no-nvml", "--kernel-log", os.DevNull,
		"--size", "1M", "--collective-size", "1M", "-n", "3", "--warmup", "1"}, extra...)
}

// TestBenchRecordThenDoctor runs kiln bench on the fixture with the fake
// driver, records the results, and has kiln doctor read the record: the
// x8 card's host link and the pairs across sockets are below their
// rating, with the causes the Snapshot shows.
func TestBenchRecordThenDoctor(t *testing.T) {
	d := fakeBench(t, nil)
	rec := filepath.Join(t.TempDir(), "bench.json")
	out, stderr, code := kiln(t, fixtureArgs("-o", "json", "--record", rec)...)
	if code != benchExitBelow {
		t.Fatalf("exit %d, want %d; stderr %s", code, benchExitBelow, stderr)
	}
	if d.Live() != 0 {
		t.Errorf("%d buffers left", d.Live())
	}
	var rep struct {
		Hostname string `json:"hostname"`
		snapshot.Measurements
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	verdicts := map[string]string{}
	for _, m := range rep.Results {
		key := m.Test + " " + strings.Join(m.Devices, ",")
		if m.Memory != "" {
			key += " " + m.Memory
			if m.HostLocal != nil && !*m.HostLocal {
				key += " remote"
			}
		}
		verdicts[key] = m.Verdict
	}
	for key, want := range map[string]string{
		"h2d 0000:41:00.0 pinned":               "below-rating", // 12 of 31.5
		"h2d 0000:41:00.0 pinned remote":        "below-rating",
		"h2d 0000:42:00.0 pinned":               "ok", // 26 of 31.5
		"h2d 0000:42:00.0 pageable":             "not-judged",
		"device 0000:c1:00.0":                   "ok", // 800 of 864
		"p2p 0000:41:00.0,0000:42:00.0":         "ok",
		"p2p 0000:41:00.0,0000:c1:00.0":         "below-rating", // across sockets
		"p2p-bidi 0000:c1:00.0,0000:c2:00.0":    "ok",
		"p2p-latency 0000:41:00.0,0000:42:00.0": "not-judged",
		// Bus bandwidth 20 x 2(4-1)/4 = 30 of the slowest pair's 31.5.
		"all-reduce " + strings.Join(fixtureGPUs, ","): "ok",
	} {
		if got := verdicts[key]; got != want {
			t.Errorf("%s: %q, want %q", key, got, want)
		}
	}
	if rep.ThresholdPercent != 70 || rep.Driver != "fake" || rep.Collectives != "fakeccl 2.0" || !strings.HasPrefix(rep.Tool, "kiln bench") {
		t.Errorf("report header %+v", rep.Measurements)
	}

	// The doctor reads the record.
	out, stderr, code = kiln(t, "doctor", "--from", rec, "-o", "json")
	if code != doctor.ExitWarning {
		t.Fatalf("doctor exit %d: %s", code, stderr)
	}
	var dr doctor.Report
	if err := json.Unmarshal(out, &dr); err != nil {
		t.Fatal(err)
	}
	var host, cross *doctor.Finding
	for i, f := range dr.Findings {
		if f.ID != "bandwidth-below-rating" {
			continue
		}
		switch strings.Join(f.Devices, ",") {
		case "0000:41:00.0":
			host = &dr.Findings[i]
		case "0000:41:00.0,0000:c1:00.0":
			cross = &dr.Findings[i]
		}
	}
	if host == nil || cross == nil {
		t.Fatalf("bandwidth findings missing: %v", dr.Findings)
	}
	if !strings.Contains(strings.Join(host.Evidence, "\n"), "link runs at x8 of x16 (downtrained)") {
		t.Errorf("host link causes: %q", host.Evidence)
	}
	if !strings.Contains(strings.Join(cross.Evidence, "\n"), "the pair is SYS") {
		t.Errorf("cross-socket causes: %q", cross.Evidence)
	}

	// kiln bench --from prints the record again, judged at a new threshold.
	out, _, code = kiln(t, "bench", "--from", rec)
	if code != benchExitBelow || !strings.Contains(string(out), "below-rating") {
		t.Errorf("--from: exit %d\n%s", code, out)
	}
	out, _, code = kiln(t, "bench", "--from", rec, "--threshold", "20", "-o", "json")
	if code != benchExitOK {
		t.Errorf("--from at 20%%: exit %d\n%s", code, out)
	}
}

// TestBenchText checks the table: every figure labelled (never a bare
// GB/s), ratings listed, the summary line.
func TestBenchText(t *testing.T) {
	fakeBench(t, nil)
	out, _, code := kiln(t, fixtureArgs("--tests", "host,device,p2p")...)
	if code != benchExitBelow {
		t.Fatalf("exit %d", code)
	}
	text := string(out)
	for _, want := range []string{
		"median of 3 timed runs after 1 warm-up; below 70% of its rating a figure is below-rating",
		"TEST", "VERDICT", "GPU0 host link", "pinned, node 0 (own)", "pageable, node 1", "GB/s (read+write)", "GB/s (bidi)",
		"ratings\n", "PCIe Gen4 x16", "figures are below 70% of the rating",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q:\n%s", want, text)
		}
	}
	if bare := regexp.MustCompile(`GB/s(?: [^(]|$)`).FindString(text); bare != "" {
		t.Errorf("a bare GB/s: %q in\n%s", bare, text)
	}
	if strings.Contains(text, "\x1b") || strings.Contains(text, "\r") {
		t.Error("progress bar drawn to a buffer that is not a terminal")
	}
}

// TestBenchFailedTest: a test that cannot run is printed with its error
// and the run exits 2.
func TestBenchFailedTest(t *testing.T) {
	fakeBench(t, func(method string, args ...any) error {
		if method == "AllocDevice" && args[0] == 3 {
			return errors.New("CUDA_ERROR_OUT_OF_MEMORY")
		}
		return nil
	})
	out, _, code := kiln(t, fixtureArgs("--tests", "device")...)
	if code != benchExitFailed || !strings.Contains(string(out), "failed\n  device GPU3 memory: allocating 1 MiB on GPU3: CUDA_ERROR_OUT_OF_MEMORY") {
		t.Errorf("exit %d\n%s", code, out)
	}
}

func TestBenchCollectiveOnly(t *testing.T) {
	fakeBench(t, nil)
	t.Setenv("KILN_WORLD_SIZE", "2")
	t.Setenv("KILN_RANK", "1")
	out, _, _ := kiln(t, fixtureArgs("--collective", "-o", "json")...)
	var rep snapshot.Measurements
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 3 {
		t.Fatalf("%d results: %+v", len(rep.Results), rep.Results)
	}
	for _, m := range rep.Results {
		if m.Direction != "bus" || m.AlgGBps == 0 {
			t.Errorf("%+v", m)
		}
	}
	if !strings.Contains(strings.Join(rep.Notes, "\n"), "rank 1 of a gang of 2: the collectives ran over this node's GPUs only") {
		t.Errorf("notes %q", rep.Notes)
	}
}

func TestBenchBadFlags(t *testing.T) {
	fakeBench(t, nil)
	dir := t.TempDir()
	noBench := filepath.Join(dir, "snap.json")
	os.WriteFile(noBench, []byte(`{"schema_version": 1, "gpus": [{"index": 0, "vendor": "nvidia", "pci_address": "0000:01:00.0"}]}`), 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--size", "3XB"}, "--size"},
		{[]string{"bench", "--gpus", "x"}, "--gpus"},
		{[]string{"bench", "--collective", "--tests", "host"}, "give one of them"},
		{[]string{"bench", "--tests", "nvlink"}, `test group "nvlink"`},
		{[]string{"bench", "-n", "0"}, "repetitions 0"},
		{[]string{"bench", "--threshold", "0"}, "--threshold"},
		{[]string{"bench", "-o", "csv"}, "-o csv"},
		{[]string{"bench", "--from", noBench}, "hold no kiln bench results"},
		{[]string{"bench", "extra"}, "unknown command"},
	} {
		_, stderr, code := kiln(t, c.args...)
		if code != benchExitCannot || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", c.args, code, stderr, c.want)
		}
	}
}

func TestProgressLine(t *testing.T) {
	if got, want := progressLine(12, 40, "h2d GPU0 pinned (NUMA node 0)", 80), "[#######.................] 12/40  h2d GPU0 pinned (NUMA node 0)"; got != want {
		t.Errorf("%q\nwant %q", got, want)
	}
	if got := progressLine(40, 40, "", 80); !strings.HasPrefix(got, "[########################] 40/40") {
		t.Errorf("done: %q", got)
	}
	if got := progressLine(1, 3, strings.Repeat("x", 200), 40); len(got) != 39 {
		t.Errorf("cut to %d columns: %q", len(got), got)
	}
	if got := progressLine(0, 0, "\x1b]0;title\a", 80); strings.ContainsAny(got, "\x1b\a") {
		t.Errorf("control characters: %q", got)
	}
}

func FuzzBenchSize(f *testing.F) {
	for _, s := range []string{"256MiB", "1G", "4096", "3XB", "", "1e3", "0.5K", "64GiB", "65G"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := benchSize(s)
		if err == nil && (v < 4 || v > 64<<30) {
			t.Fatalf("%q: %d bytes accepted", s, v)
		}
	})
}
