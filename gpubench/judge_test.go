package gpubench_test

import (
	"encoding/json"
	"strings"
	"testing"

	"kiln.dev/kiln/gpubench"
	"kiln.dev/kiln/gpubench/benchtest"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

func link(maxGen, maxWidth, gen, width int) *snapshot.PCIeLink {
	return &snapshot.PCIeLink{MaxGen: maxGen, MaxWidth: maxWidth, CurrentGen: gen, CurrentWidth: width}
}

// switchNode is two H100 SXM GPUs (0000:11:00.0, 0000:21:00.0, the fake
// driver's addresses) under one Gen5 PCIe switch on NUMA node 0 of two;
// GPU1 has trained at x8.
func switchNode() *snapshot.Snapshot {
	s := snapshot.New()
	s.Host.Hostname = "gpu-test-1"
	s.Host.NUMANodes = []snapshot.NUMANode{{ID: 0}, {ID: 1}}
	zero := snapshot.Ptr(0)
	s.PCI = []snapshot.PCIDevice{
		{Address: "0000:0f:01.0", Kind: snapshot.KindRootPort, NUMANode: zero, Link: link(5, 16, 5, 16)},
		{Address: "0000:10:00.0", Kind: snapshot.KindSwitchUp, Parent: "0000:0f:01.0", NUMANode: zero, Link: link(5, 16, 5, 16)},
		{Address: "0000:1a:00.0", Kind: snapshot.KindSwitchDown, Parent: "0000:10:00.0", NUMANode: zero, Link: link(5, 16, 5, 16)},
		{Address: "0000:1a:01.0", Kind: snapshot.KindSwitchDown, Parent: "0000:10:00.0", NUMANode: zero, Link: link(5, 16, 5, 8)},
		{Address: "0000:11:00.0", Kind: snapshot.KindGPU, Parent: "0000:1a:00.0", NUMANode: zero, Link: link(5, 16, 5, 16)},
		{Address: "0000:21:00.0", Kind: snapshot.KindGPU, Parent: "0000:1a:01.0", NUMANode: zero, Link: link(5, 16, 5, 8)},
	}
	for i, addr := range []string{"0000:11:00.0", "0000:21:00.0"} {
		ds := []string{"0000:1a:00.0", "0000:1a:01.0"}[i]
		s.GPUs = append(s.GPUs, snapshot.GPU{
			Index: i, Vendor: snapshot.VendorNVIDIA, Model: "NVIDIA H100 80GB HBM3", DeviceID: "2330",
			PCIAddress: addr, NUMANode: zero, Upstream: []string{ds, "0000:10:00.0", "0000:0f:01.0"},
			PCIe: s.PCI[4+i].Link,
		})
	}
	return s
}

func meas(test string, gbps float64, devs ...string) snapshot.Measurement {
	m := snapshot.Measurement{Test: test, Devices: devs, GPUs: make([]int, len(devs)), MedianGBps: gbps, MinGBps: gbps, MaxGBps: gbps}
	for i := range m.GPUs {
		m.GPUs[i] = 9 // a driver ordinal the Snapshot does not use
	}
	return m
}

const (
	g0 = "0000:11:00.0"
	g1 = "0000:21:00.0"
)

func TestJudge(t *testing.T) {
	yes := true
	pinned := func(m snapshot.Measurement) snapshot.Measurement {
		m.Memory, m.HostLocal, m.HostNUMANode = "pinned", &yes, snapshot.Ptr(0)
		return m
	}
	pageable := pinned(meas("h2d", 20, g0))
	pageable.Memory = "pageable"
	failed := meas("d2h", 0, g1)
	failed.Error = "out of memory"
	lat := meas("p2p-latency", 0, g0, g1)
	lat.MedianUS = 3.2
	ms := &snapshot.Measurements{Results: []snapshot.Measurement{
		pinned(meas("h2d", 52, g0)),
		pinned(meas("h2d", 26, g1)),
		pageable,
		meas("device", 2800, g0),
		meas("p2p", 20, g0, g1),
		meas("p2p-bidi", 100, g0, g1),
		lat,
		meas("all-reduce", 30, g0, g1),
		failed,
		meas("device", 2800, "0000:99:00.0"),
	}}
	gpubench.Judge(ms, switchNode(), nil, kb.Default(), 0)
	gen5x16 := kb.Default().PCIeGBpsUni(5, 16)
	want := []struct {
		link, verdict string
		rated         float64
		basis         string
	}{
		{"GPU0 host link", "ok", gen5x16, "PCIe Gen5 x16, the slowest of 2 links between GPU0 and its root port (at 0000:11:00.0)"},
		{"GPU1 host link", "below-rating", gen5x16, "PCIe Gen5 x16"},
		{"GPU0 host link", "not-judged", gen5x16, "PCIe Gen5 x16"},
		{"GPU0 memory", "ok", 3350, "H100-SXM5-80GB memory bandwidth"},
		{"GPU0->GPU1 (PIX)", "below-rating", gen5x16, "PCIe Gen5 x16"},
		{"GPU0<->GPU1 (PIX)", "ok", 2 * gen5x16, "PCIe Gen5 x16"},
		{"GPU0->GPU1 (PIX)", "not-judged", gen5x16, ""},
		{"all-reduce over 2 GPUs", "below-rating", gen5x16, "the slowest GPU pair, GPU0-GPU1 (PIX), per direction"},
		{"GPU1 host link", "failed", gen5x16, ""},
		{"GPU9 memory", "not-rated", 0, ""},
	}
	if ms.ThresholdPercent != 70 {
		t.Errorf("threshold %v, want the default 70", ms.ThresholdPercent)
	}
	for i, w := range want {
		m := ms.Results[i]
		if m.Link != w.link || m.Verdict != w.verdict || !near(m.RatedGBps, w.rated) || !strings.HasPrefix(m.RatedBasis, w.basis) {
			t.Errorf("%d %s: link %q verdict %q rated %v basis %q; want %q %q %v %q...", i, m.Test, m.Link, m.Verdict, m.RatedGBps, m.RatedBasis, w.link, w.verdict, w.rated, w.basis)
		}
		if m.RatedGBps > 0 && m.MedianGBps > 0 && !near(m.Ratio, m.MedianGBps/m.RatedGBps) {
			t.Errorf("%d: ratio %v", i, m.Ratio)
		}
	}
	// The GPUs become the Snapshot's indexes.
	if g := ms.Results[4].GPUs; g[0] != 0 || g[1] != 1 {
		t.Errorf("p2p GPUs %v, want [0 1]", g)
	}
	if g := ms.Results[9].GPUs; g[0] != 9 {
		t.Errorf("a GPU the Snapshot lacks keeps the driver's number: %v", g)
	}

	// A lower threshold passes GPU1's host link (41%).
	gpubench.Judge(ms, switchNode(), nil, kb.Default(), 40)
	if v := ms.Results[1].Verdict; v != "ok" || ms.ThresholdPercent != 40 {
		t.Errorf("at 40%%: %q", v)
	}
}

// TestJudgeHostLinkFallbacks: without a PCI tree the GPU's own link rates
// it; without a link read, the catalog's card rating; NVLink-C2C where a
// source states its bandwidth.
func TestJudgeHostLinkFallbacks(t *testing.T) {
	s := snapshot.New()
	s.GPUs = []snapshot.GPU{{Vendor: snapshot.VendorNVIDIA, DeviceID: "2330", PCIAddress: g0, PCIe: link(4, 16, 4, 16)}}
	ms := &snapshot.Measurements{Results: []snapshot.Measurement{meas("h2d", 25, g0)}}
	gpubench.Judge(ms, s, nil, nil, 0)
	if m := ms.Results[0]; !near(m.RatedGBps, kb.Default().PCIeGBpsUni(4, 16)) || m.RatedBasis != "PCIe Gen4 x16, GPU0's link" || m.Verdict != "ok" {
		t.Errorf("own link: %+v", m)
	}
	s.GPUs[0].PCIe = nil
	gpubench.Judge(ms, s, nil, nil, 0)
	if m := ms.Results[0]; !near(m.RatedGBps, kb.Default().PCIeGBpsUni(5, 16)) || !strings.Contains(m.RatedBasis, "catalog") {
		t.Errorf("catalog: %+v", m)
	}
	s.Links = []snapshot.Link{{A: g0, B: "cpu0", Kind: snapshot.LinkC2C, BandwidthGBpsUni: 450}}
	gpubench.Judge(ms, s, nil, nil, 0)
	if m := ms.Results[0]; m.RatedGBps != 450 || m.Verdict != "below-rating" {
		t.Errorf("c2c: %+v", m)
	}
}

// TestJudgeCollectiveAcrossNodes: a collective over several nodes crosses
// the network, which kiln does not rate.
func TestJudgeCollectiveAcrossNodes(t *testing.T) {
	ms := &snapshot.Measurements{Ranks: 16, Results: []snapshot.Measurement{meas("all-reduce", 30, g0, g1)}}
	gpubench.Judge(ms, switchNode(), nil, nil, 0)
	if m := ms.Results[0]; m.Verdict != "not-rated" || m.Link != "all-reduce over 16 ranks (2 GPUs here)" {
		t.Errorf("%+v", m)
	}
}

// TestRunThenJudge runs the fake on the two-GPU node and judges it: the
// rates the fake gives decide the verdicts.
func TestRunThenJudge(t *testing.T) {
	d := newFakeOnSwitchNode()
	p := small()
	p.Groups = []string{gpubench.GroupHost, gpubench.GroupP2P}
	ms := run(t, d, gpubench.Options{Plan: p})
	gpubench.Judge(ms, switchNode(), nil, nil, 0)
	for _, m := range ms.Results {
		want := "ok"
		switch {
		case m.Memory == "pageable":
			want = "not-judged"
		case m.Test == "h2d" && m.Devices[0] == g1, m.Test == "d2h" && m.Devices[0] == g1:
			want = "below-rating"
		}
		if m.Verdict != want {
			t.Errorf("%s %s %v: %v GB/s of %v: %s, want %s", m.Test, m.Memory, m.Devices, m.MedianGBps, m.RatedGBps, m.Verdict, want)
		}
	}
}

// newFakeOnSwitchNode is the fake driver with switchNode's GPUs: host
// copies at 50 GB/s, GPU1's at 25 (its link is x8), pageable at 20, p2p at
// 50.
func newFakeOnSwitchNode() *benchtest.Driver {
	d := benchtest.New(2, 0, 1)
	d.Rate = func(c benchtest.Copy) float64 {
		host := c.Src.Kind != gpubench.DeviceMemory || c.Dst.Kind != gpubench.DeviceMemory
		switch {
		case c.Src.Kind == gpubench.HostPageable || c.Dst.Kind == gpubench.HostPageable:
			return 20
		case host && c.Stream.Device == 1:
			return 25
		}
		return 50
	}
	return d
}

// FuzzJudge judges records as a file could hold them: it must never fail,
// and every verdict must follow from the figure, the rating and the
// threshold.
func FuzzJudge(f *testing.F) {
	f.Add(`{"tool":"kiln bench","driver":"cuda","threshold_percent":70,"results":[{"test":"h2d","devices":["0000:11:00.0"],"gpus":[0],"memory":"pinned","bytes":1,"warmup":0,"repetitions":1,"median_gbps":20,"verdict":""}]}`, 70.0)
	f.Add(`{"tool":"","driver":"","threshold_percent":0,"ranks":3,"results":[{"test":"all-gather","devices":["0000:11:00.0","0000:21:00.0"],"gpus":[],"bytes":0,"warmup":0,"repetitions":0,"median_gbps":1,"verdict":""}]}`, 0.0)
	f.Add(`{"tool":"","driver":"","threshold_percent":0,"results":[{"test":"p2p-bidi","devices":["0000:21:00.0","zz"],"gpus":[1],"bytes":0,"warmup":0,"repetitions":0,"median_gbps":-1,"verdict":""}]}`, -3.0)
	f.Fuzz(func(t *testing.T, doc string, threshold float64) {
		var ms snapshot.Measurements
		if err := json.Unmarshal([]byte(doc), &ms); err != nil {
			return
		}
		gpubench.Judge(&ms, switchNode(), nil, kb.Default(), threshold)
		for _, m := range ms.Results {
			switch m.Verdict {
			case "ok", "below-rating":
				if m.RatedGBps <= 0 || m.Error != "" {
					t.Fatalf("judged without a rating: %+v", m)
				}
				if below := m.Ratio*100 < ms.ThresholdPercent; below != (m.Verdict == "below-rating") {
					t.Fatalf("verdict %s at ratio %v and threshold %v", m.Verdict, m.Ratio, ms.ThresholdPercent)
				}
			case "not-rated", "not-judged", "failed":
			default:
				t.Fatalf("verdict %q", m.Verdict)
			}
		}
	})
}
