package topo

import (
	"fmt"

	"kiln.dev/kiln/snapshot"
)

// fixture builds hand-made snapshots shaped like real machines.
type fixture struct{ s *snapshot.Snapshot }

func newFixture(numaCPUs ...string) *fixture {
	s := snapshot.New()
	for i, c := range numaCPUs {
		s.Host.NUMANodes = append(s.Host.NUMANodes, snapshot.NUMANode{ID: i, CPUs: c})
	}
	return &fixture{s: s}
}

func lnk(maxGen, maxWidth, curGen, curWidth int) *snapshot.PCIeLink {
	return &snapshot.PCIeLink{MaxGen: maxGen, MaxWidth: maxWidth, CurrentGen: curGen, CurrentWidth: curWidth}
}

// pci adds a PCI function. numa < 0 leaves it unknown.
func (f *fixture) pci(addr, kind, parent string, numa int, l *snapshot.PCIeLink) *fixture {
	d := snapshot.PCIDevice{Address: addr, Kind: kind, Parent: parent, Link: l}
	if numa >= 0 {
		d.NUMANode = snapshot.Ptr(numa)
	}
	f.s.PCI = append(f.s.PCI, d)
	return f
}

func (f *fixture) nic(addr, parent, iface string, numa int, l *snapshot.PCIeLink) *fixture {
	f.pci(addr, snapshot.KindNIC, parent, numa, l)
	f.s.PCI[len(f.s.PCI)-1].Interface = iface
	f.s.PCI[len(f.s.PCI)-1].Name = "Mellanox ConnectX-7"
	return f
}

// gpu adds a GPU and its own PCI function.
func (f *fixture) gpu(g snapshot.GPU, parent string) *fixture {
	g.Index = len(f.s.GPUs)
	f.s.GPUs = append(f.s.GPUs, g)
	if parent != "" {
		numa := -1
		if g.NUMANode != nil {
			numa = *g.NUMANode
		}
		f.pci(g.PCIAddress, snapshot.KindGPU, parent, numa, g.PCIe)
	}
	return f
}

// hgxH100 is an 8x H100 SXM5 HGX board as the lspci capture of one shows
// it: per GPU a root port, a Gen5 PCIe switch with the GPU, a ConnectX-7
// and an NVMe drive below it; GPU0-3 on NUMA node 0, GPU4-7 on node 1; four
// NVSwitches; every GPU with 18 active NVLinks into the NVSwitches.
func hgxH100() *snapshot.Snapshot {
	f := newFixture("0-55,112-167", "56-111,168-223")
	roots := []int{0x15, 0x37, 0x48, 0x59, 0x97, 0xb7, 0xc7, 0xd7}
	for i, bus := range roots {
		numa := i / 4
		rp := fmt.Sprintf("0000:%02x:01.0", bus)
		up := fmt.Sprintf("0000:%02x:00.0", bus+1)
		f.pci(rp, snapshot.KindRootPort, "", numa, lnk(5, 16, 5, 16))
		f.pci(up, snapshot.KindSwitchUp, rp, numa, lnk(5, 16, 5, 16))
		for dev := 0; dev < 3; dev++ {
			f.pci(fmt.Sprintf("0000:%02x:%02x.0", bus+2, dev), snapshot.KindSwitchDown, up, numa, lnk(5, 16, 5, 16))
		}
		f.pci(fmt.Sprintf("0000:%02x:00.0", bus+3), snapshot.KindNVMe, fmt.Sprintf("0000:%02x:00.0", bus+2), numa, lnk(4, 4, 4, 4))
		f.nic(fmt.Sprintf("0000:%02x:00.0", bus+5), fmt.Sprintf("0000:%02x:02.0", bus+2), fmt.Sprintf("mlx5_%d", i), numa, lnk(5, 16, 5, 16))
		var links []snapshot.NVLink
		for l := 0; l < 18; l++ {
			links = append(links, snapshot.NVLink{Link: l, State: "active", SpeedGBps: 26.562, RemoteKind: snapshot.KindNVSwitch})
		}
		f.gpu(snapshot.GPU{
			Vendor: snapshot.VendorNVIDIA, Model: "NVIDIA H100 80GB HBM3", DeviceID: "2330",
			PCIAddress: fmt.Sprintf("0000:%02x:00.0", bus+4), NUMANode: snapshot.Ptr(numa),
			PCIe: lnk(5, 16, 5, 16), NVLinks: links,
		}, fmt.Sprintf("0000:%02x:01.0", bus+2))
	}
	for _, bus := range []int{0x83, 0x84, 0x85, 0x86} {
		f.pci(fmt.Sprintf("0000:%02x:00.0", bus), snapshot.KindNVSwitch, "", 1, nil)
	}
	return f.s
}

// twoSwitches is a PCIe-only server: NUMA node 0 has a Gen4 switch with
// GPU0 and a NIC on it and a second switch below it with GPU1; NUMA node 1
// has one switch with GPU2 and GPU3, GPU3 in an x8 slot (its downstream
// port is x8). GPU2 is capable of x16 but trained at x8 now.
func twoSwitches() *snapshot.Snapshot {
	f := newFixture("0-31", "32-63")
	g := func(addr string, numa int, l *snapshot.PCIeLink) snapshot.GPU {
		return snapshot.GPU{Vendor: snapshot.VendorNVIDIA, Model: "NVIDIA L40S", PCIAddress: addr, NUMANode: snapshot.Ptr(numa), PCIe: l}
	}
	f.pci("0000:00:01.0", snapshot.KindRootPort, "", 0, lnk(4, 16, 4, 16)).
		pci("0000:01:00.0", snapshot.KindSwitchUp, "0000:00:01.0", 0, lnk(4, 16, 4, 16)).
		pci("0000:02:00.0", snapshot.KindSwitchDown, "0000:01:00.0", 0, lnk(4, 16, 4, 16)).
		pci("0000:02:01.0", snapshot.KindSwitchDown, "0000:01:00.0", 0, lnk(4, 16, 4, 16)).
		pci("0000:02:02.0", snapshot.KindSwitchDown, "0000:01:00.0", 0, lnk(4, 16, 4, 16)).
		pci("0000:04:00.0", snapshot.KindSwitchUp, "0000:02:01.0", 0, lnk(4, 16, 4, 16)).
		pci("0000:05:00.0", snapshot.KindSwitchDown, "0000:04:00.0", 0, lnk(4, 16, 4, 16)).
		gpu(g("0000:03:00.0", 0, lnk(4, 16, 4, 16)), "0000:02:00.0").
		gpu(g("0000:06:00.0", 0, lnk(4, 16, 4, 16)), "0000:05:00.0").
		nic("0000:07:00.0", "0000:02:02.0", "mlx5_0", 0, lnk(4, 16, 4, 16))
	f.pci("0000:80:01.0", snapshot.KindRootPort, "", 1, lnk(4, 16, 4, 16)).
		pci("0000:81:00.0", snapshot.KindSwitchUp, "0000:80:01.0", 1, lnk(4, 16, 4, 16)).
		pci("0000:82:00.0", snapshot.KindSwitchDown, "0000:81:00.0", 1, lnk(4, 16, 4, 8)).
		pci("0000:82:01.0", snapshot.KindSwitchDown, "0000:81:00.0", 1, lnk(4, 8, 4, 8)).
		gpu(g("0000:83:00.0", 1, lnk(4, 16, 4, 8)), "0000:82:00.0").
		gpu(g("0000:84:00.0", 1, lnk(4, 16, 4, 8)), "0000:82:01.0")
	return f.s
}

// consumerPair is two RTX 4090s on two root ports of one socket. sameBus
// puts both root ports on root bus 00 (one host bridge); otherwise they
// sit on buses 00 and 40 (two host bridges of one NUMA node).
func consumerPair(sameBus bool, numa int) *snapshot.Snapshot {
	f := newFixture("0-31", "32-63")
	second := "0000:40:01.1"
	if sameBus {
		second = "0000:00:03.1"
	}
	var n *int
	if numa >= 0 {
		n = snapshot.Ptr(numa)
	}
	f.pci("0000:00:01.1", snapshot.KindRootPort, "", numa, lnk(5, 16, 1, 16)).
		pci(second, snapshot.KindRootPort, "", numa, lnk(5, 16, 1, 16))
	f.gpu(snapshot.GPU{Vendor: snapshot.VendorNVIDIA, Model: "NVIDIA GeForce RTX 4090", PCIAddress: "0000:01:00.0", NUMANode: n,
		PCIe: &snapshot.PCIeLink{MaxGen: 4, MaxWidth: 16, CurrentGen: 1, CurrentWidth: 16, HostMaxGen: 5}}, "0000:00:01.1")
	busB := "0000:41:00.0"
	if sameBus {
		busB = "0000:02:00.0"
	}
	f.gpu(snapshot.GPU{Vendor: snapshot.VendorNVIDIA, Model: "NVIDIA GeForce RTX 4090", PCIAddress: busB, NUMANode: n,
		PCIe: &snapshot.PCIeLink{MaxGen: 4, MaxWidth: 16, CurrentGen: 4, CurrentWidth: 16, HostMaxGen: 5}}, second)
	return f.s
}

// mi210Hives is 8 MI210 in two xGMI hives of 4 as the KFD topology of one
// shows it: intra-hive xGMI links of weight 15 and 50000 MB/s, GPUs 0-3
// on NUMA node 0, 4-7 on node 1, no PCIe tree. The links carry xGMI
// generation 3 (MI200 series) so the fixture does not depend on the GPU
// table.
func mi210Hives() *snapshot.Snapshot {
	f := newFixture("0-63", "64-127")
	hives := []string{"12609507387757274807", "18091350218769748594"}
	buses := []int{0x03, 0x23, 0x43, 0x63, 0x83, 0xa3, 0xc3, 0xe3}
	for i, bus := range buses {
		f.gpu(snapshot.GPU{Vendor: snapshot.VendorAMD, Model: "AMD Instinct MI210", DeviceID: "740f", GFXTarget: "gfx90a",
			PCIAddress: fmt.Sprintf("0000:%02x:00.0", bus), NUMANode: snapshot.Ptr(i / 4), XGMIHive: hives[i/4],
			PCIe: lnk(4, 16, 4, 16)}, "")
	}
	for h := 0; h < 2; h++ {
		for a := 4 * h; a < 4*h+4; a++ {
			for b := a + 1; b < 4*h+4; b++ {
				f.s.Links = append(f.s.Links, snapshot.Link{
					A: f.s.GPUs[a].PCIAddress, B: f.s.GPUs[b].PCIAddress, Kind: snapshot.LinkXGMI,
					Weight: 15, Hops: 1, BandwidthGBpsUni: 50, Version: 3,
				})
			}
		}
	}
	return f.s
}

// b300TopoM is what an importer of the b300x8-cx8-bond-topo-m.txt capture
// produces: GPUs known only by their matrix names, no PCI information.
func b300TopoM() *snapshot.Snapshot {
	s := snapshot.New()
	mx := &snapshot.TopoMatrix{Source: "nvidia-smi-topo", Aliases: map[string]string{}, CPUAffinity: map[string]string{}, NUMA: map[string]int{}}
	for i := 0; i < 8; i++ {
		mx.Devices = append(mx.Devices, fmt.Sprintf("GPU%d", i))
		s.GPUs = append(s.GPUs, snapshot.GPU{Index: i, Vendor: snapshot.VendorNVIDIA, MatrixName: fmt.Sprintf("GPU%d", i)})
	}
	for i := 0; i < 8; i++ {
		mx.Devices = append(mx.Devices, fmt.Sprintf("NIC%d", i))
		mx.Aliases[fmt.Sprintf("NIC%d", i)] = fmt.Sprintf("mlx5_bond_%d", i)
	}
	side := func(i int) int { return (i % 8) / 4 }
	for i := 0; i < 16; i++ {
		row := make([]string, 16)
		for j := 0; j < 16; j++ {
			gi, gj := i < 8, j < 8
			switch {
			case i == j:
				row[j] = "X"
			case gi && gj:
				row[j] = "NV18"
			case side(i) != side(j):
				row[j] = "SYS"
			case !gi && !gj:
				row[j] = "NODE"
			case i%8 == j%8:
				row[j] = "PXB"
			default:
				row[j] = "NODE"
			}
		}
		mx.Cells = append(mx.Cells, row)
	}
	for i := 0; i < 8; i++ {
		name := fmt.Sprintf("GPU%d", i)
		mx.NUMA[name] = i / 4
		mx.CPUAffinity[name] = []string{"0-63,128-191", "64-127,192-255"}[i/4]
	}
	s.Matrix = mx
	return s
}
