package doctor

import (
	"encoding/json"
	"strings"
	"testing"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

// gen5 is PCIe Gen5 x16 per direction, as kiln bench rates the healthy
// node's host links.
const gen5 = 63.01536

func benchMeas(test string, gbps, rated float64, devs ...string) snapshot.Measurement {
	return snapshot.Measurement{Test: test, Devices: devs, GPUs: make([]int, len(devs)), Direction: "uni",
		Bytes: 256 << 20, Warmup: 2, Repetitions: 10,
		MedianGBps: gbps, MinGBps: gbps * 0.98, MaxGBps: gbps * 1.01, RatedGBps: rated, Ratio: gbps / rated}
}

func hostMeas(test string, gbps float64, dev string, node int, local bool) snapshot.Measurement {
	m := benchMeas(test, gbps, gen5, dev)
	m.Memory, m.HostNUMANode, m.HostLocal = "pinned", &node, &local
	m.Link = "GPU1 host link"
	m.RatedBasis = "PCIe Gen5 x16, the slowest of 2 links between GPU1 and its root port"
	return m
}

func withBench(s *snapshot.Snapshot, threshold float64, ms ...snapshot.Measurement) *snapshot.Snapshot {
	s.Measurements = &snapshot.Measurements{Tool: "kiln bench", Driver: "cuda", ThresholdPercent: threshold, Results: ms}
	return s
}

func bandwidthFindings(t *testing.T, s *snapshot.Snapshot) []Finding {
	t.Helper()
	var out []Finding
	for _, f := range run(t, s).Findings {
		if f.ID == "bandwidth-below-rating" {
			out = append(out, f)
		}
	}
	return out
}

func evidenceHas(f Finding, sub string) bool {
	for _, e := range f.Evidence {
		if strings.Contains(e, sub) {
			return true
		}
	}
	return false
}

// TestBandwidthDowntrainedHostLink: GPU 1 trained at x8 moves host data at
// a third of its Gen5 x16 rating; the finding names the link, both
// figures, and the narrow link as the cause.
func TestBandwidthDowntrainedHostLink(t *testing.T) {
	s := healthy()
	s.GPUs[1].PCIe.CurrentWidth = 8
	withBench(s, 70, hostMeas("h2d", 22, g1, 0, true), hostMeas("d2h", 24, g1, 0, true), hostMeas("h2d", 55, g0, 0, true))
	fs := bandwidthFindings(t, s)
	if len(fs) != 1 {
		t.Fatalf("%d findings, want one for GPU 1's host link: %+v", len(fs), fs)
	}
	f := fs[0]
	if f.Severity != Warning || len(f.Devices) != 1 || f.Devices[0] != g1 {
		t.Errorf("severity %s devices %v", f.Severity, f.Devices)
	}
	if want := "host link of GPU 1 (0000:19:00.0) measured at 34.9% of its rating (h2d 22 GB/s (uni) of 63 GB/s (uni))"; f.Title != want {
		t.Errorf("title %q\nwant  %q", f.Title, want)
	}
	if !evidenceHas(f, "h2d pinned from NUMA node 0 (the GPU's own), GPU1 host link: 22 GB/s (uni), median of 10") ||
		!evidenceHas(f, "d2h pinned") || !evidenceHas(f, "rated 63 GB/s (uni) (PCIe Gen5 x16") {
		t.Errorf("evidence %q", f.Evidence)
	}
	if !evidenceHas(f, "likely cause: GPU 1 (0000:19:00.0)'s link runs at x8 of x16 (downtrained)") {
		t.Errorf("no downtrained cause: %q", f.Evidence)
	}
	if !evidenceHas(f, "the PCIe switch at 0000:16:00.0, shared by 2 GPUs") {
		t.Errorf("no switch cause: %q", f.Evidence)
	}
	if !strings.Contains(f.Remedy, "Reseat the card") || f.ImpactPercent == nil || *f.ImpactPercent < 65 || *f.ImpactPercent > 65.2 {
		t.Errorf("remedy %q impact %v", f.Remedy, f.ImpactPercent)
	}
}

// TestBandwidthRemoteNUMA: only the copies from the far NUMA node are
// slow: NUMA placement is the cause.
func TestBandwidthRemoteNUMA(t *testing.T) {
	s := healthy()
	withBench(s, 70, hostMeas("h2d", 55, g0, 0, true), hostMeas("h2d", 30, g0, 1, false))
	fs := bandwidthFindings(t, s)
	if len(fs) != 1 || !evidenceHas(fs[0], "likely cause: host memory on another NUMA node than GPU 0 (0000:18:00.0)'s (node 0): the copies crossed the inter-socket link; from the GPU's own node the link is within its rating") {
		t.Fatalf("%+v", fs)
	}
	if !strings.Contains(fs[0].Remedy, "numactl") {
		t.Errorf("remedy %q", fs[0].Remedy)
	}
}

// TestBandwidthP2PBlockedByACS: a pair under one switch with ACS redirect
// on and no peer access.
func TestBandwidthP2PBlockedByACS(t *testing.T) {
	s := healthy()
	for k := range s.GPUs {
		s.GPUs[k].NVLinks = nil
	}
	s.PCI[2].ACS = &snapshot.ACS{ReqRedir: true, CmpltRedir: true}
	no := false
	m := benchMeas("p2p", 9, gen5, g1, g0)
	m.PeerAccess = &no
	bidi := benchMeas("p2p-bidi", 18, 2*gen5, g0, g1)
	bidi.Direction, bidi.PeerAccess = "bidi", &no
	withBench(s, 70, m, bidi)
	fs := bandwidthFindings(t, s)
	if len(fs) != 1 {
		t.Fatalf("%d findings, want one per pair: %+v", len(fs), fs)
	}
	f := fs[0]
	if !strings.HasPrefix(f.Title, "peer-to-peer link GPU 0 (0000:18:00.0) - GPU 1 (0000:19:00.0) measured at 14.3% of its rating") {
		t.Errorf("title %q", f.Title)
	}
	if !evidenceHas(f, "no direct peer access") || !evidenceHas(f, "ACS redirect is on at 0000:17:00.0") || !evidenceHas(f, "18 GB/s (bidi)") {
		t.Errorf("evidence %q", f.Evidence)
	}
	if !strings.Contains(f.Remedy, "Disable ACS redirect") {
		t.Errorf("remedy %q", f.Remedy)
	}
}

func TestBandwidthCollectiveAndMemory(t *testing.T) {
	s := healthy()
	s.Host.Virtualized = "kvm"
	s.GPUs[0].Clocks = &snapshot.Clocks{MemoryMHz: p(1593), MaxMemoryMHz: p(2619)}
	mem := benchMeas("device", 1200, 3350, g0)
	mem.Direction = "read+write"
	coll := benchMeas("all-reduce", 90, 450, g0, g1)
	coll.Direction = "bus"
	withBench(s, 70, mem, coll)
	fs := bandwidthFindings(t, s)
	if len(fs) != 2 {
		t.Fatalf("%d findings: %+v", len(fs), fs)
	}
	var memF, collF Finding
	for _, f := range fs {
		if strings.HasPrefix(f.Title, "memory of") {
			memF = f
		} else {
			collF = f
		}
	}
	if !evidenceHas(memF, "memory clock read 1593 MHz of 2619 MHz") || !strings.Contains(memF.Title, "1200 GB/s (read+write) of 3350 GB/s (read+write)") {
		t.Errorf("memory finding %+v", memF)
	}
	if !strings.HasPrefix(collF.Title, "all-reduce over 2 GPUs measured at 20% of its rating (all-reduce 90 GB/s (bus) of 450 GB/s (bus))") ||
		!evidenceHas(collF, "virtual machine (kvm)") {
		t.Errorf("collective finding %+v", collF)
	}
}

// TestBandwidthQuiet: figures at or above the threshold, figures kept for
// reference, failed tests and unrated links give no finding; the record's
// own threshold decides.
func TestBandwidthQuiet(t *testing.T) {
	pageable := hostMeas("h2d", 10, g0, 0, true)
	pageable.Memory = "pageable"
	lat := benchMeas("p2p-latency", 0, 0, g0, g1)
	lat.MedianUS = 3
	failed := hostMeas("d2h", 1, g0, 0, true)
	failed.Error = "out of memory"
	unrated := benchMeas("device", 100, 0, g0)
	for name, ms := range map[string][]snapshot.Measurement{
		"at 80%":   {hostMeas("h2d", 0.8*gen5, g0, 0, true)},
		"pageable": {pageable},
		"latency":  {lat},
		"failed":   {failed},
		"unrated":  {unrated},
		"unknown":  {benchMeas("all-to-all", 1, 100, g0, g1)},
	} {
		if fs := bandwidthFindings(t, withBench(healthy(), 70, ms...)); len(fs) != 0 {
			t.Errorf("%s: %+v", name, fs)
		}
	}
	// 60% passes a record judged at 50%, and fails one judged at the default.
	if fs := bandwidthFindings(t, withBench(healthy(), 50, hostMeas("h2d", 0.6*gen5, g0, 0, true))); len(fs) != 0 {
		t.Errorf("at 50%%: %+v", fs)
	}
	if fs := bandwidthFindings(t, withBench(healthy(), 0, hostMeas("h2d", 0.6*gen5, g0, 0, true))); len(fs) != 1 {
		t.Errorf("default threshold: %d findings", len(fs))
	}
	// No record, no finding.
	if fs := bandwidthFindings(t, healthy()); len(fs) != 0 {
		t.Errorf("no record: %+v", fs)
	}
}

// TestBandwidthNoCauseKnown: nothing the Snapshot tells explains the
// figure; the finding says what to check that kiln cannot read.
func TestBandwidthNoCauseKnown(t *testing.T) {
	s := healthy()
	s.GPUs[0].Upstream = nil
	fs := bandwidthFindings(t, withBench(s, 70, hostMeas("h2d", 20, g0, 0, true)))
	if len(fs) != 1 || !evidenceHas(fs[0], "nothing kiln read explains it") || !strings.Contains(fs[0].Remedy, "iommu=pt") {
		t.Fatalf("%+v", fs)
	}
}

// FuzzBandwidth feeds the check records as a kiln bench file could hold
// them (JSON of the measurements): it must never fail, and every finding
// it gives must name a figure below the record's threshold.
func FuzzBandwidth(f *testing.F) {
	f.Add(`{"tool":"kiln bench","driver":"cuda","threshold_percent":70,"results":[{"test":"h2d","devices":["0000:19:00.0"],"gpus":[1],"memory":"pinned","bytes":1,"warmup":0,"repetitions":1,"median_gbps":20,"rated_gbps":63,"verdict":"below-rating"}]}`)
	f.Add(`{"tool":"","driver":"","threshold_percent":0,"results":[{"test":"p2p","devices":[],"gpus":null,"bytes":0,"warmup":0,"repetitions":0,"median_gbps":1,"rated_gbps":1e308,"verdict":""}]}`)
	f.Add(`{"tool":"","driver":"","threshold_percent":-5,"results":[{"test":"all-reduce","devices":["x","0000:18:00.0","0000:18:00.0"],"gpus":[],"bytes":0,"warmup":0,"repetitions":0,"median_gbps":1,"rated_gbps":2,"verdict":"ok"}]}`)
	f.Fuzz(func(t *testing.T, doc string) {
		var ms snapshot.Measurements
		if err := json.Unmarshal([]byte(doc), &ms); err != nil {
			return
		}
		s := healthy()
		s.Measurements = &ms
		in := &Input{Snapshot: s, KB: kb.Default()}
		for _, fd := range checkBandwidth(in) {
			if fd.ID != "bandwidth-below-rating" || fd.Title == "" || len(fd.Evidence) == 0 {
				t.Fatalf("finding %+v", fd)
			}
		}
	})
}
