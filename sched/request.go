package sched

import (
	"errors"
	"fmt"
)

// Request asks for one placement on one node. Exactly one of GPUs,
// GPUMilli and MIGProfile may be set; with none the request needs CPU and
// memory only.
type Request struct {
	// ID names the allocation; it must be unique in a State.
	ID string `json:"id"`
	// GPUs is a number of whole GPUs, all on one node.
	GPUs int `json:"gpus,omitempty"`
	// GPUMilli is a share of one GPU in thousandths (1-999), with
	// GPUMemoryBytes of its memory (0: no memory share is tracked).
	GPUMilli       int    `json:"gpu_milli,omitempty"`
	GPUMemoryBytes uint64 `json:"gpu_memory_bytes,omitempty"`
	// MIGProfile asks for one MIG GPU instance of that profile ("1g.10gb").
	MIGProfile string `json:"mig_profile,omitempty"`
	// CPUMilli and MemoryBytes are host resources.
	CPUMilli    int64  `json:"cpu_milli,omitempty"`
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`

	Constraints Constraints `json:"constraints,omitzero"`
	Locality    Locality    `json:"locality,omitzero"`
	// Priority orders the members of a gang (higher first); Project is
	// recorded in the allocation.
	Priority int    `json:"priority,omitempty"`
	Project  string `json:"project,omitempty"`
}

// Constraints restrict the devices and nodes a request may use. An empty
// field does not constrain. A constraint on a value the inventory does not
// know (no compute capability, no driver version) is not met.
type Constraints struct {
	// Models: any of these GPU models; "A100" matches every A100 model.
	Models []string `json:"models,omitempty"`
	// Architecture: "Hopper", "CDNA 3" (case-insensitive).
	Architecture string `json:"architecture,omitempty"`
	Vendor       string `json:"vendor,omitempty"`
	// GFXTargets: any of these AMD targets ("gfx942").
	GFXTargets []string `json:"gfx_targets,omitempty"`
	// MinMemoryBytes is the least memory each GPU must have.
	MinMemoryBytes uint64 `json:"min_memory_bytes,omitempty"`
	// MinComputeCapability: "8.0".
	MinComputeCapability string `json:"min_compute_capability,omitempty"`
	// MinDriver ("535.54.03") is a floor on the GPU's kernel driver (the
	// NVIDIA driver, or amdgpu for an AMD GPU), MinCUDA ("12.2") on the CUDA
	// version the NVIDIA driver supports (MatchDevice).
	MinDriver string `json:"min_driver,omitempty"`
	MinCUDA   string `json:"min_cuda,omitempty"`
}

// Locality asks for the GPUs of one request to be close.
type Locality struct {
	// SameNVLinkIsland: every pair of the GPUs is joined by NVLink or xGMI.
	SameNVLinkIsland bool `json:"same_nvlink_island,omitempty"`
	// SameNUMA: all GPUs on one known NUMA node.
	SameNUMA bool `json:"same_numa,omitempty"`
}

// Gang is several requests placed all together or not at all, possibly on
// different nodes.
type Gang struct {
	ID      string    `json:"id"`
	Members []Request `json:"members"`
}

// Kind of a request.
type Kind int

// Request kinds.
const (
	KindCPU Kind = iota
	KindWhole
	KindFraction
	KindMIG
)

func (k Kind) String() string {
	return [...]string{"cpu", "whole", "fraction", "mig"}[k]
}

// Kind says what the request asks for.
func (r *Request) Kind() Kind {
	switch {
	case r.GPUs > 0:
		return KindWhole
	case r.GPUMilli > 0:
		return KindFraction
	case r.MIGProfile != "":
		return KindMIG
	}
	return KindCPU
}

// Validate checks that the request is well formed.
func (r *Request) Validate() error {
	var errs []error
	if r.ID == "" {
		errs = append(errs, errors.New("request has no id"))
	}
	set := 0
	if r.GPUs != 0 {
		set++
	}
	if r.GPUMilli != 0 {
		set++
	}
	if r.MIGProfile != "" {
		set++
	}
	if set > 1 {
		errs = append(errs, fmt.Errorf("request %s: ask for whole GPUs, a GPU share or a MIG profile, not several", r.ID))
	}
	if r.GPUs < 0 || r.GPUs > MaxDevices {
		errs = append(errs, fmt.Errorf("request %s: %d GPUs is out of range 1-%d", r.ID, r.GPUs, MaxDevices))
	}
	if r.GPUMilli < 0 || r.GPUMilli >= 1000 {
		errs = append(errs, fmt.Errorf("request %s: a GPU share of %d milli is out of range 1-999 (ask for whole GPUs instead)", r.ID, r.GPUMilli))
	}
	if r.GPUMemoryBytes > 0 && r.GPUMilli == 0 {
		errs = append(errs, fmt.Errorf("request %s: GPU memory is given only with a GPU share", r.ID))
	}
	if r.CPUMilli < 0 {
		errs = append(errs, fmt.Errorf("request %s: negative CPU", r.ID))
	}
	return errors.Join(errs...)
}

// Allocation is where one request was placed.
type Allocation struct {
	RequestID string `json:"request_id"`
	Gang      string `json:"gang,omitempty"`
	// Node is the node's name, NodeIndex its position in the cluster.
	Node      string `json:"node"`
	NodeIndex int    `json:"node_index"`
	// Devices are the GPU shares, in device order.
	Devices     []Share `json:"devices,omitempty"`
	CPUMilli    int64   `json:"cpu_milli,omitempty"`
	MemoryBytes uint64  `json:"memory_bytes,omitempty"`
	Priority    int     `json:"priority,omitempty"`
	Project     string  `json:"project,omitempty"`
	// WorstLink is the class of the slowest pair among the devices (empty
	// for fewer than two).
	WorstLink string `json:"worst_link,omitempty"`
	// Score is the weighted score the node won with.
	Score float64 `json:"score"`
}

// Share is what an allocation holds on one device.
type Share struct {
	Device int    `json:"device"`
	PCI    string `json:"pci,omitempty"`
	UUID   string `json:"uuid,omitempty"`
	// Milli is the share of the GPU's compute in thousandths (1000: whole).
	Milli       int    `json:"milli"`
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
	MIG         *Slot  `json:"mig,omitempty"`
}

// Slot is a MIG GPU instance an allocation holds.
type Slot struct {
	Profile string `json:"profile"`
	// Start and Size in memory slices, Compute in compute slices.
	Start   int `json:"start"`
	Size    int `json:"size"`
	Compute int `json:"compute"`
	// Existing is the GPU instance id when the allocation claims an
	// instance that already exists; -1 when a new one is to be created.
	Existing int `json:"existing"`
}

// Plan is the allocations of a gang (or of one request), to be committed
// together.
type Plan struct {
	Gang        string       `json:"gang,omitempty"`
	Allocations []Allocation `json:"allocations"`
}
