// Package shapes builds Snapshots of common GPU server layouts, for tests,
// benchmarks and examples of the placement engine. Each is modelled on a
// real class of machine; none is a recording.
package shapes

import (
	"fmt"

	"kiln.dev/kiln/snapshot"
)

// Shape is a named server layout.
type Shape struct {
	Name string
	// Describe says what the layout models.
	Describe string
	Build    func(host string) *snapshot.Snapshot
}

// All returns the four layouts of the topology scenario.
func All() []Shape {
	return []Shape{
		{"nvlink-pairs-8", "8 GPUs (A100 80GB PCIe) bridged in NVLink pairs (NV12), 4 per PCIe switch, one switch per socket", NVLinkPairs8},
		{"pcie-switches-8", "8 GPUs (L40S) on two PCIe Gen4 switches, one per socket, no NVLink", PCIeSwitches8},
		{"nvswitch-8", "8 GPUs (H100 SXM5) all-to-all through NVSwitches (NV18), each on its own switch and root port", NVSwitch8},
		{"root-ports-4", "4 GPUs (RTX 4090) each on its own root port, two per socket on one host bridge", RootPorts4},
	}
}

type builder struct{ s *snapshot.Snapshot }

func newBuilder(host string, sockets int) *builder {
	s := snapshot.New()
	s.Host.Hostname = host
	s.Host.CPUs = 64 * sockets
	s.Host.MemoryBytes = uint64(sockets) * 512 << 30
	for i := 0; i < sockets; i++ {
		s.Host.NUMANodes = append(s.Host.NUMANodes, snapshot.NUMANode{ID: i, CPUs: fmt.Sprintf("%d-%d", 64*i, 64*i+63)})
	}
	s.Drivers.NVIDIAUser = "550.90.07"
	s.Drivers.CUDADriver = "12.4"
	return &builder{s: s}
}

func link(gen, width int) *snapshot.PCIeLink {
	return &snapshot.PCIeLink{MaxGen: gen, MaxWidth: width, CurrentGen: gen, CurrentWidth: width}
}

func (b *builder) pci(addr, kind, parent string, numa int, l *snapshot.PCIeLink) {
	b.s.PCI = append(b.s.PCI, snapshot.PCIDevice{Address: addr, Kind: kind, Parent: parent, NUMANode: snapshot.Ptr(numa), Link: l})
}

func (b *builder) gpu(g snapshot.GPU, parent string, numa int) {
	g.Index = len(b.s.GPUs)
	g.NUMANode = snapshot.Ptr(numa)
	g.UUID = fmt.Sprintf("GPU-%s-%d", b.s.Host.Hostname, g.Index)
	b.s.GPUs = append(b.s.GPUs, g)
	b.pci(g.PCIAddress, snapshot.KindGPU, parent, numa, g.PCIe)
}

// switched puts 4 GPUs per socket behind one PCIe switch per socket.
func switched(host, model, deviceID string, gen int) *builder {
	b := newBuilder(host, 2)
	for sock, bus := range []int{0x10, 0x90} {
		rp := fmt.Sprintf("0000:%02x:01.0", bus)
		up := fmt.Sprintf("0000:%02x:00.0", bus+1)
		b.pci(rp, snapshot.KindRootPort, "", sock, link(gen, 16))
		b.pci(up, snapshot.KindSwitchUp, rp, sock, link(gen, 16))
		for k := 0; k < 4; k++ {
			down := fmt.Sprintf("0000:%02x:%02x.0", bus+2, k)
			b.pci(down, snapshot.KindSwitchDown, up, sock, link(gen, 16))
			b.gpu(snapshot.GPU{Vendor: snapshot.VendorNVIDIA, Model: model, DeviceID: deviceID,
				PCIAddress: fmt.Sprintf("0000:%02x:00.0", bus+3+k), PCIe: link(gen, 16)}, down, sock)
		}
	}
	return b
}

// NVLinkPairs8 is 8 A100 80GB PCIe cards joined in pairs by NVLink bridges
// (12 links each), GPUs 0-3 behind the switch of socket 0, 4-7 of socket 1.
func NVLinkPairs8(host string) *snapshot.Snapshot {
	b := switched(host, "NVIDIA A100 80GB PCIe", "20b5", 4)
	for p := 0; p < 8; p += 2 {
		b.s.Links = append(b.s.Links, snapshot.Link{A: b.s.GPUs[p].PCIAddress, B: b.s.GPUs[p+1].PCIAddress,
			Kind: snapshot.LinkNVLink, Count: 12, Version: 3})
	}
	return b.s
}

// PCIeSwitches8 is 8 L40S on two PCIe Gen4 switches, one per socket.
func PCIeSwitches8(host string) *snapshot.Snapshot {
	return switched(host, "NVIDIA L40S", "26b9", 4).s
}

// NVSwitch8 is an HGX H100 board: every GPU behind its own PCIe switch and
// root port, 18 NVLinks from each GPU into four NVSwitches.
func NVSwitch8(host string) *snapshot.Snapshot {
	b := newBuilder(host, 2)
	for i, bus := range []int{0x15, 0x37, 0x48, 0x59, 0x97, 0xb7, 0xc7, 0xd7} {
		sock := i / 4
		rp := fmt.Sprintf("0000:%02x:01.0", bus)
		up := fmt.Sprintf("0000:%02x:00.0", bus+1)
		down := fmt.Sprintf("0000:%02x:00.0", bus+2)
		b.pci(rp, snapshot.KindRootPort, "", sock, link(5, 16))
		b.pci(up, snapshot.KindSwitchUp, rp, sock, link(5, 16))
		b.pci(down, snapshot.KindSwitchDown, up, sock, link(5, 16))
		var nv []snapshot.NVLink
		for l := 0; l < 18; l++ {
			nv = append(nv, snapshot.NVLink{Link: l, State: "active", Version: 4, RemoteKind: snapshot.KindNVSwitch})
		}
		b.gpu(snapshot.GPU{Vendor: snapshot.VendorNVIDIA, Model: "NVIDIA H100 80GB HBM3", DeviceID: "2330",
			PCIAddress: fmt.Sprintf("0000:%02x:00.0", bus+3), PCIe: link(5, 16), NVLinks: nv}, down, sock)
	}
	for _, bus := range []int{0x83, 0x84, 0x85, 0x86} {
		b.pci(fmt.Sprintf("0000:%02x:00.0", bus), snapshot.KindNVSwitch, "", 1, nil)
	}
	return b.s
}

// RootPorts4 is 4 RTX 4090 each on its own root port: two on host bridge
// 0000:00 of socket 0, two on host bridge 0000:80 of socket 1.
func RootPorts4(host string) *snapshot.Snapshot {
	b := newBuilder(host, 2)
	for i, rp := range []string{"0000:00:01.0", "0000:00:03.0", "0000:80:01.0", "0000:80:03.0"} {
		sock := i / 2
		b.pci(rp, snapshot.KindRootPort, "", sock, link(4, 16))
		b.gpu(snapshot.GPU{Vendor: snapshot.VendorNVIDIA, Model: "NVIDIA GeForce RTX 4090", DeviceID: "2684",
			PCIAddress: fmt.Sprintf("0000:%02x:00.0", []int{0x01, 0x02, 0x81, 0x82}[i]), PCIe: link(4, 16)}, rp, sock)
	}
	return b.s
}
