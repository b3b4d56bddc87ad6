package sched

import (
	"errors"
	"fmt"

	"kiln.dev/kiln/kb"
)

// MaxDevices is the most GPUs one node may have: device sets are bit masks.
const MaxDevices = 64

// Node is one machine as the scheduler sees it.
type Node struct {
	Name string `json:"name"`
	// CPUMilli and MemoryBytes are the node's CPU (milli-cores) and host
	// memory; zero means unknown, and an unknown capacity is not enforced.
	CPUMilli    int64  `json:"cpu_milli,omitempty"`
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
	// Driver is the NVIDIA driver version ("535.54.03"), CUDA the highest
	// CUDA version it supports ("12.2"), AMDGPU the amdgpu driver version
	// ("6.8.5"), ROCm the ROCm release; empty when unknown.
	Driver string `json:"driver,omitempty"`
	CUDA   string `json:"cuda,omitempty"`
	AMDGPU string `json:"amdgpu,omitempty"`
	ROCm   string `json:"rocm,omitempty"`
	// Devices are the node's GPUs; Devices[i].Index is i.
	Devices []Device `json:"devices"`
	// Links[i][j] is the connection between Devices[i] and Devices[j].
	// A nil matrix means nothing is known about the links.
	Links [][]Link `json:"links,omitempty"`
	// Unhealthy lists node-wide critical findings; a node with any is not
	// schedulable.
	Unhealthy []string `json:"unhealthy,omitempty"`
	// Notes say what could not be read while building the node.
	Notes []string `json:"notes,omitempty"`
}

// Device is one physical GPU.
type Device struct {
	Index int    `json:"index"`
	PCI   string `json:"pci,omitempty"`
	UUID  string `json:"uuid,omitempty"`
	// Vendor is nvidia, amd or intel.
	Vendor string `json:"vendor"`
	// Model is the knowledge base's normal form ("A100-SXM4-80GB") when the
	// model is known to it, else the name the source printed.
	Model             string `json:"model,omitempty"`
	Architecture      string `json:"architecture,omitempty"`
	ComputeCapability string `json:"compute_capability,omitempty"`
	GFXTarget         string `json:"gfx_target,omitempty"`
	MemoryBytes       uint64 `json:"memory_bytes,omitempty"`
	// NUMA is the device's NUMA node, -1 when unknown.
	NUMA int `json:"numa"`
	// MIG is the device's MIG geometry when it is MIG-capable (nil
	// otherwise). A MIG-enabled device serves MIG requests only.
	MIG        *kb.MIGModel `json:"mig,omitempty"`
	MIGEnabled bool         `json:"mig_enabled,omitempty"`
	// MIGInstances are the GPU instances that exist on the device; a MIG
	// request of the same profile may claim one, and no new instance may
	// overlap them.
	MIGInstances []MIGInstance `json:"mig_instances,omitempty"`
	// Unhealthy lists the critical findings about this device; a device
	// with any is never allocated.
	Unhealthy []string `json:"unhealthy,omitempty"`
}

// Healthy reports whether the device may be allocated.
func (d *Device) Healthy() bool { return len(d.Unhealthy) == 0 }

// MIGInstance is a GPU instance that exists on a device.
type MIGInstance struct {
	// GI is the GPU instance id the driver gave it.
	GI      int    `json:"gi"`
	Profile string `json:"profile"`
	// Start and Size are in memory slices; Compute in compute slices.
	Start   int `json:"start"`
	Size    int `json:"size"`
	Compute int `json:"compute"`
}

// Link is the connection between two devices of a node.
type Link struct {
	// Class is nvidia-smi topo's name: NV#, XGMI, PIX, PXB, PHB, NODE,
	// SYS, or "?" when unknown.
	Class string `json:"class"`
	// Rank orders classes, smaller is better (topo.Cell.Rank).
	Rank int `json:"rank"`
	// GBps is the rated bandwidth per direction; zero when unknown.
	GBps float64 `json:"gbps,omitempty"`
}

// rankUnknown is the rank of a link nothing is known about.
const rankUnknown = 1000

// validate checks what the engine relies on: device indexes, the size of
// the link matrix, MIG instances inside their geometry.
func (n *Node) validate() error {
	var errs []error
	if len(n.Devices) > MaxDevices {
		errs = append(errs, fmt.Errorf("node %s: %d GPUs, at most %d are supported", n.Name, len(n.Devices), MaxDevices))
	}
	for i := range n.Devices {
		d := &n.Devices[i]
		if d.Index != i {
			errs = append(errs, fmt.Errorf("node %s: device %d has index %d", n.Name, i, d.Index))
		}
		if d.MIGEnabled && d.MIG == nil {
			errs = append(errs, fmt.Errorf("node %s: GPU %d has MIG enabled but no MIG geometry", n.Name, i))
		}
		var used uint32
		for _, in := range d.MIGInstances {
			if d.MIG == nil || in.Start < 0 || in.Size <= 0 || in.Start+in.Size > d.MIG.MemorySlices {
				errs = append(errs, fmt.Errorf("node %s: GPU %d: MIG instance %d (%s) lies outside the GPU's slices", n.Name, i, in.GI, in.Profile))
				continue
			}
			s := span(in.Start, in.Size)
			if used&s != 0 {
				errs = append(errs, fmt.Errorf("node %s: GPU %d: MIG instance %d (%s) overlaps another", n.Name, i, in.GI, in.Profile))
			}
			used |= s
		}
	}
	if n.Links != nil {
		if len(n.Links) != len(n.Devices) {
			errs = append(errs, fmt.Errorf("node %s: link matrix has %d rows for %d GPUs", n.Name, len(n.Links), len(n.Devices)))
		} else {
			for i, row := range n.Links {
				if len(row) != len(n.Devices) {
					errs = append(errs, fmt.Errorf("node %s: link matrix row %d has %d cells for %d GPUs", n.Name, i, len(row), len(n.Devices)))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// span is the bit mask of memory slices [start, start+n).
func span(start, n int) uint32 {
	if n <= 0 || start < 0 || start+n > 32 {
		return 0
	}
	return ((uint32(1) << n) - 1) << start
}
