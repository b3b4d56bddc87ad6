package topo

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"testing"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

// FuzzBuild feeds arbitrary snapshots (as JSON) to Build and the renderers:
// no panic, a square symmetric matrix, X on the diagonal, bandwidths
// non-negative with bidi twice uni, canonical PCI addresses, and SVG that
// parses as XML.
func FuzzBuild(f *testing.F) {
	// Small seeds keep the fuzzer fast; the HGX fixture is covered by tests.
	for _, s := range []*snapshot.Snapshot{twoSwitches(), consumerPair(false, 0), consumerPair(true, -1), mi210Hives(), b300TopoM()} {
		b, err := json.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"gpus":[{"index":0,"pci_address":"0:1:0.0","upstream":["0:0:1.0","0:0:1.0"]},{"index":0,"matrix_name":"GPU0"}],"matrix":{"devices":["GPU0","NIC0"],"cells":[["X"],["NV","PIX","SYS"]],"hops":[[1]]},"pci":[{"address":"0000:00:01.0","parent":"0000:01:00.0","kind":"root-port"},{"address":"0000:01:00.0","parent":"0000:00:01.0","kind":"nic"}]}`))
	k := kb.Default()
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 8<<10 {
			return
		}
		var s snapshot.Snapshot
		if json.Unmarshal(data, &s) != nil {
			return
		}
		m, err := Build(&s, k)
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		n := len(m.Devices)
		if len(m.Cells) != n {
			t.Fatalf("%d rows for %d devices", len(m.Cells), n)
		}
		for i := range m.Cells {
			if len(m.Cells[i]) != n || m.Cells[i][i].Class != ClassSelf {
				t.Fatalf("row %d malformed", i)
			}
			for j, c := range m.Cells[i] {
				if c != m.Cells[j][i] {
					t.Fatalf("not symmetric at %d,%d", i, j)
				}
				if c.GBpsUni < 0 || c.NowGBpsUni < 0 || c.Links < 0 || c.GBpsBidi != 2*c.GBpsUni || math.IsNaN(c.GBpsUni) {
					t.Fatalf("cell %d,%d: %+v", i, j, c)
				}
			}
		}
		for _, d := range m.Devices {
			if d.PCI != "" {
				if c, err := snapshot.CanonicalPCI(d.PCI); err != nil || c != d.PCI {
					t.Fatalf("device %s address %q not canonical", d.Name, d.PCI)
				}
			}
		}
		for _, g := range m.GPUs() {
			m.NearestNIC(g)
		}
		var buf bytes.Buffer
		if err := WriteText(&buf, m); err != nil {
			t.Fatal(err)
		}
		if err := WriteDOT(&buf, m); err != nil {
			t.Fatal(err)
		}
		buf.Reset()
		if err := WriteSVG(&buf, m); err != nil {
			t.Fatal(err)
		}
		dec := xml.NewDecoder(&buf)
		for {
			_, err := dec.Token()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("SVG not well-formed: %v", err)
			}
		}
	})
}

// FuzzTree builds snapshots from bytes: a PCI forest with arbitrary parents
// (cycles, self-parents, dangling parents), kinds, link states, NUMA nodes,
// NVLinks, xGMI links and a matrix, so that odd trees reach Build.
func FuzzTree(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20})
	f.Add([]byte("\x05\x01\x00\x02\x01\x03\x02\x04\x03\x00\x10\x20\x30\x40\x50\x60\x70\x80\x90"))
	f.Add(bytes.Repeat([]byte{7, 3, 250, 1}, 16))
	kinds := []string{snapshot.KindRootPort, snapshot.KindSwitchUp, snapshot.KindSwitchDown, snapshot.KindBridge,
		snapshot.KindHostBridge, snapshot.KindGPU, snapshot.KindNIC, snapshot.KindNVMe, snapshot.KindNVSwitch, "", "other"}
	k := kb.Default()
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 512 {
			return
		}
		at := 0
		next := func() int {
			if at >= len(data) {
				return 0
			}
			at++
			return int(data[at-1])
		}
		addr := func(v int) string { return "0000:" + hex2(v%32) + ":00.0" }
		s := snapshot.New()
		s.Host.NUMANodes = make([]snapshot.NUMANode, next()%3)
		for i := range s.Host.NUMANodes {
			s.Host.NUMANodes[i].ID = i
		}
		nPCI := next() % 24
		for i := 0; i < nPCI; i++ {
			d := snapshot.PCIDevice{Address: addr(i), Kind: kinds[next()%len(kinds)]}
			if p := next(); p%4 != 0 {
				d.Parent = addr(p)
			}
			if v := next(); v%3 != 0 {
				d.NUMANode = snapshot.Ptr(v%4 - 1)
			}
			if v := next(); v%2 == 0 {
				d.Link = &snapshot.PCIeLink{MaxGen: v % 8, MaxWidth: next() % 33, CurrentGen: next() % 8, CurrentWidth: next() % 33}
			}
			s.PCI = append(s.PCI, d)
		}
		nGPU := next() % 9
		for i := 0; i < nGPU; i++ {
			g := snapshot.GPU{Index: next() % 9, PCIAddress: addr(next()), Vendor: snapshot.VendorNVIDIA, MatrixName: "GPU" + hex2(i)}
			if v := next(); v%2 == 0 {
				g.Upstream = []string{addr(v), addr(next()), addr(next())}
			}
			if v := next(); v%3 == 0 {
				g.NUMANode = snapshot.Ptr(v%3 - 1)
			}
			for l := next() % 20; l > 0; l-- {
				nl := snapshot.NVLink{Link: l, State: "active"}
				switch next() % 4 {
				case 0:
					nl.RemoteKind = snapshot.KindNVSwitch
				case 1:
					nl.RemoteKind, nl.RemotePCI = "gpu", addr(next())
				case 2:
					nl.RemotePCI = addr(next())
				}
				g.NVLinks = append(g.NVLinks, nl)
			}
			s.GPUs = append(s.GPUs, g)
		}
		for l := next() % 6; l > 0; l-- {
			kind := snapshot.LinkNVLink
			if next()%2 == 0 {
				kind = snapshot.LinkXGMI
			}
			s.Links = append(s.Links, snapshot.Link{A: addr(next()), B: addr(next()), Kind: kind, Count: next() - 10, Version: next() % 7, ViaSwitch: next()%2 == 0, Hops: next() % 3})
		}
		if v := next(); v%2 == 0 {
			mx := &snapshot.TopoMatrix{Source: "nvidia-smi-topo"}
			classes := []string{"X", "NV4", "NV", "XGMI", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC", "PCIE", "", "junk"}
			size := next() % 10
			for i := 0; i < size; i++ {
				mx.Devices = append(mx.Devices, "GPU"+hex2(i))
				row := make([]string, next()%(size+1))
				for j := range row {
					row[j] = classes[next()%len(classes)]
				}
				mx.Cells = append(mx.Cells, row)
			}
			s.Matrix = mx
		}
		m, err := Build(s, k)
		if err != nil {
			t.Fatal(err)
		}
		for i := range m.Cells {
			for j, c := range m.Cells[i] {
				if c != m.Cells[j][i] || c.GBpsUni < 0 || c.GBpsBidi != 2*c.GBpsUni {
					t.Fatalf("cell %d,%d: %+v", i, j, c)
				}
			}
		}
		var buf bytes.Buffer
		_ = WriteText(&buf, m)
		_ = WriteDOT(&buf, m)
		buf.Reset()
		_ = WriteSVG(&buf, m)
		dec := xml.NewDecoder(&buf)
		for {
			_, err := dec.Token()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("SVG not well-formed: %v", err)
			}
		}
	})
}

func hex2(v int) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[(v/16)%16], digits[v%16]})
}
