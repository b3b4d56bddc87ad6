package plan

import (
	"fmt"
	"math"
	"strings"

	"kiln.dev/kiln/topo"
)

// Calibrated link constants: the share of a link's rated bandwidth that
// collective libraries (NCCL, RCCL) reach on large messages, and the
// latency of one step of a collective.
const (
	effNVLink  = 0.80 // NCCL bus bandwidth on NVSwitch/NVLink, of the rated figure
	effPCIeSw  = 0.75 // through one or more PCIe switches (PIX, PXB)
	effPCIeHB  = 0.65 // through the host bridge (PHB) or across root ports (NODE)
	effPCIeSys = 0.40 // across the CPU interconnect (SYS): P2P is slow or staged in host memory
	effNetwork = 0.85 // InfiniBand/RoCE, of the line rate

	alphaLink    = 3e-6 // seconds per ring step inside a node
	alphaNetwork = 8e-6 // seconds per ring step across the network
)

// commGroup is a set of GPUs that run a collective together: the
// bandwidth its slowest link gives per direction (already scaled by the
// efficiency), the per-step latency and the link in words.
type commGroup struct {
	size  int
	gbps  float64 // effective GB/s per direction
	alpha float64
	desc  string
	cross bool // spans nodes
}

func linkEff(class string) float64 {
	c := strings.ToUpper(class)
	switch {
	case strings.HasPrefix(c, "NV"), c == topo.ClassXGMI:
		return effNVLink
	case c == topo.ClassPIX, c == topo.ClassPXB:
		return effPCIeSw
	case c == topo.ClassPHB, c == topo.ClassNode, c == "PCIE":
		return effPCIeHB
	}
	return effPCIeSys
}

// group returns the worst group of size members whose ranks are stride
// apart (ranks are laid out tensor-parallel innermost, then data, then
// pipeline parallel, as Megatron-LM and most frameworks do).
func (c *Cluster) group(stride, size int) commGroup {
	if size <= 1 {
		return commGroup{size: 1}
	}
	G := c.GPUsPerNode
	if (size-1)*stride >= G || G == 0 {
		net := c.NetworkGBps * effNetwork
		g := commGroup{size: size, gbps: net, alpha: alphaNetwork, cross: true,
			desc: fmt.Sprintf("network %.0f Gb/s per GPU", c.NetworkGBps*8)}
		// The part of the ring inside a node can be slower still (PCIe).
		if in := c.group(stride, max(1, min(size, G/max(stride, 1)))); in.size > 1 && in.gbps < net {
			g.gbps, g.desc = in.gbps, in.desc+" and the network"
		}
		return g
	}
	worst := commGroup{size: size, gbps: -1, alpha: alphaLink}
	for base := 0; base+(size-1)*stride < G; base++ {
		if (base/stride)%size != 0 {
			continue // not the first member of a group
		}
		minBW, minClass := -1.0, ""
		allXGMI := true
		for a := 0; a < size; a++ {
			for b := a + 1; b < size; b++ {
				l := c.Links[base+a*stride][base+b*stride]
				if !strings.EqualFold(l.Class, topo.ClassXGMI) {
					allXGMI = false
				}
				bw := l.GBpsUni * linkEff(l.Class)
				if minBW < 0 || bw < minBW {
					minBW, minClass = bw, l.Class
				}
			}
		}
		rated := minBW / linkEff(minClass)
		if allXGMI {
			// A full xGMI mesh: every peer has its own link, and collectives
			// use them all at once.
			minBW *= float64(size - 1)
		}
		if worst.gbps < 0 || minBW < worst.gbps {
			worst.gbps = minBW
			worst.desc = fmt.Sprintf("%s %.0f GB/s (uni)", linkWord(minClass), rated)
			if allXGMI && size > 2 {
				worst.desc = fmt.Sprintf("xGMI mesh %d x %.0f GB/s (uni)", size-1, rated)
			}
		}
	}
	if worst.gbps <= 0 {
		worst.gbps = 1 // never divide by zero; a link of unknown speed is slow
	}
	return worst
}

func linkWord(class string) string {
	c := strings.ToUpper(class)
	switch {
	case strings.HasPrefix(c, "NV"):
		return "NVLink " + class
	case c == topo.ClassXGMI:
		return "xGMI"
	case c == topo.ClassPIX:
		return "PCIe switch (PIX)"
	case c == topo.ClassPXB:
		return "PCIe switches (PXB)"
	case c == topo.ClassPHB:
		return "PCIe host bridge (PHB)"
	case c == topo.ClassNode:
		return "PCIe across root ports (NODE)"
	case c == topo.ClassSys:
		return "PCIe across CPU sockets (SYS)"
	}
	return "link " + class
}

// allReduce is an all-reduce of bytes: the ring's bandwidth term and the
// latency of a tree (NCCL picks trees and low-latency protocols for small
// messages, so latency grows with log2 of the group).
func (g commGroup) allReduce(bytes float64) float64 {
	if g.size <= 1 {
		return 0
	}
	n := float64(g.size)
	return 2*(n-1)/n*bytes/(g.gbps*1e9) + 2*math.Ceil(math.Log2(n))*g.alpha
}

// gather is an all-gather (or reduce-scatter) whose full result is bytes.
func (g commGroup) gather(bytes float64) float64 {
	if g.size <= 1 {
		return 0
	}
	n := float64(g.size)
	return (n-1)/n*bytes/(g.gbps*1e9) + math.Ceil(math.Log2(n))*g.alpha
}

// send is a point-to-point transfer of bytes.
func (g commGroup) send(bytes float64) float64 {
	if g.size <= 1 {
		return 0
	}
	return bytes/(g.gbps*1e9) + g.alpha
}
