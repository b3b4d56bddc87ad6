package compat

import (
	"fmt"
	"strings"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

// Verdict is what will happen when the image runs on a GPU.
type Verdict string

// Verdicts, from best to worst.
const (
	// Runs: the driver and the GPU meet every requirement.
	Runs Verdict = "runs"
	// RunsForwardCompat: it runs only through the CUDA forward-compatibility
	// package the image carries (datacenter GPUs only).
	RunsForwardCompat Verdict = "runs-with-forward-compat"
	// RunsViaJIT: no machine code for this GPU; the driver compiles the
	// image's PTX at start-up (a delay, and code not tuned for the GPU).
	RunsViaJIT Verdict = "runs-via-jit"
	// Unknown: kiln lacks a fact it needs (the GPU's model, compute
	// capability or gfx target, the driver, a code object's variant, a
	// version newer than its tables); the reasons say what and how to tell it.
	Unknown Verdict = "unknown"
	// Fails: the container does not start, or its GPU code cannot run.
	Fails Verdict = "fails"
)

func (v Verdict) rank() int {
	switch v {
	case Runs:
		return 0
	case RunsForwardCompat:
		return 1
	case RunsViaJIT:
		return 2
	case Unknown:
		return 3
	}
	return 4
}

// worse returns the worse of two verdicts.
func worse(a, b Verdict) Verdict {
	if b.rank() > a.rank() {
		return b
	}
	return a
}

// Runs reports whether the verdict lets the image run (with or without a
// caveat). Unknown does not: kiln never says "runs" for what it cannot tell.
func (v Verdict) Runs() bool { return v != Fails && v != Unknown && v != "" }

// Report is kiln compat's answer for one image and a set of nodes.
type Report struct {
	Requirements *Requirements `json:"requirements"`
	Nodes        []NodeReport  `json:"nodes"`
	// AllRun is true when the image runs on every GPU of every node.
	AllRun bool `json:"all_run"`
	// AnyUnknown is true when kiln could not tell for some GPU.
	AnyUnknown bool `json:"any_unknown,omitempty"`
	// AnyFails is true when the image fails on some GPU.
	AnyFails bool `json:"any_fails,omitempty"`
}

// NodeReport is the verdict for one node.
type NodeReport struct {
	Node string `json:"node"`
	// Driver is the NVIDIA driver or amdgpu version; DriverCUDA the newest
	// CUDA the NVIDIA driver supports.
	Driver     string      `json:"driver,omitempty"`
	DriverCUDA string      `json:"driver_cuda,omitempty"`
	Verdict    Verdict     `json:"verdict"`
	GPUs       []GPUReport `json:"gpus"`
	// Reasons apply to the node as a whole (no GPU found).
	Reasons []string `json:"reasons,omitempty"`
}

// GPUReport is the verdict for one GPU.
type GPUReport struct {
	Index             int     `json:"index"`
	PCIAddress        string  `json:"pci_address,omitempty"`
	Vendor            string  `json:"vendor"`
	Model             string  `json:"model,omitempty"`
	ComputeCapability string  `json:"compute_capability,omitempty"`
	GFXTarget         string  `json:"gfx_target,omitempty"`
	Verdict           Verdict `json:"verdict"`
	// Reasons say why, in words; Fix says what to change.
	Reasons []string `json:"reasons"`
	Fix     []string `json:"fix,omitempty"`
	// Binaries is the verdict of each file with GPU code on this GPU.
	Binaries []BinaryVerdict `json:"binaries,omitempty"`
}

// BinaryVerdict is what one file's GPU code does on one GPU.
type BinaryVerdict struct {
	Path    string  `json:"path"`
	Verdict Verdict `json:"verdict"`
	// Uses is the code that runs: "sm_86", "compute_80 (PTX ISA 7.8) by JIT",
	// "gfx90a:xnack-".
	Uses string `json:"uses,omitempty"`
	// Reason says why it fails or why kiln cannot tell.
	Reason string `json:"reason,omitempty"`
}

// Node is a node to check: a name for the report and its Snapshot.
type Node struct {
	Name     string
	Snapshot *snapshot.Snapshot
}

// Evaluate checks the image against every node. Requirements are per node
// because a multi-platform image gives each node architecture its own.
func Evaluate(reqs []*Requirements, nodes []Node, k *kb.KB) *Report {
	rep := &Report{AllRun: true}
	for _, req := range reqs {
		req.resolve(k)
	}
	for i, n := range nodes {
		req := reqs[min(i, len(reqs)-1)]
		if rep.Requirements == nil {
			rep.Requirements = req
		}
		nr := Check(req, n, k)
		if !nr.Verdict.Runs() {
			rep.AllRun = false
		}
		switch nr.Verdict {
		case Fails:
			rep.AnyFails = true
		case Unknown:
			rep.AnyUnknown = true
		}
		for _, g := range nr.GPUs {
			switch g.Verdict {
			case Fails:
				rep.AnyFails = true
			case Unknown:
				rep.AnyUnknown = true
			}
		}
		rep.Nodes = append(rep.Nodes, nr)
	}
	if len(nodes) == 0 {
		rep.AllRun = false
	}
	return rep
}

// ExitCode is 0 when the image runs on every GPU (with or without a
// caveat), 1 when it fails somewhere, and 2 when it fails nowhere but kiln
// could not tell for some GPU.
func (r *Report) ExitCode() int {
	switch {
	case r.AllRun:
		return 0
	case r.AnyUnknown && !r.AnyFails:
		return 2
	}
	return 1
}

// Check gives the verdict for every GPU of one node.
func Check(req *Requirements, n Node, k *kb.KB) NodeReport {
	s := n.Snapshot
	req.resolve(k)
	nr := NodeReport{Node: n.Name, Verdict: Runs}
	if s == nil {
		nr.Verdict = Fails
		nr.Reasons = []string{"no node data"}
		return nr
	}
	if nr.Node == "" {
		nr.Node = s.Host.Hostname
	}
	nr.Driver = firstNonEmpty(s.Drivers.NVIDIAUser, s.Drivers.NVIDIAKernel, s.Drivers.AMDGPU)
	if d := firstNonEmpty(s.Drivers.NVIDIAUser, s.Drivers.NVIDIAKernel); d != "" {
		nr.DriverCUDA = firstNonEmpty(k.MaxCUDAForDriver(d), s.Drivers.CUDADriver)
	}
	if len(s.GPUs) == 0 {
		nr.Verdict = Fails
		nr.Reasons = []string{"kiln found no GPU in this node's data"}
		return nr
	}
	for _, g := range s.GPUs {
		gr := checkGPU(req, s, g, k)
		nr.Verdict = worse(nr.Verdict, gr.Verdict)
		nr.GPUs = append(nr.GPUs, gr)
	}
	return nr
}

// gpuCtx is one GPU with what the catalog knows of it.
type gpuCtx struct {
	g     snapshot.GPU
	model kb.GPUModel
	known bool
	name  string // short model name for sentences
}

func (c gpuCtx) class() string {
	if !c.known {
		return ""
	}
	return c.model.Class
}

func checkGPU(req *Requirements, s *snapshot.Snapshot, g snapshot.GPU, k *kb.KB) GPUReport {
	c := gpuCtx{g: g}
	c.model, c.known = k.GPUByDeviceID(g.Vendor, g.DeviceID)
	if !c.known && g.Model != "" {
		c.model, c.known = k.GPUByName(g.Model)
	}
	c.name = firstNonEmpty(c.model.Name, g.Model, g.Vendor+" GPU")
	cc := firstNonEmpty(g.ComputeCapability, c.model.ComputeCapability)
	gfx := firstNonEmpty(g.GFXTarget, c.model.GFXTarget)
	r := &GPUReport{
		Index: g.Index, PCIAddress: g.PCIAddress, Vendor: g.Vendor,
		Model: firstNonEmpty(g.Model, c.model.Name), ComputeCapability: cc, GFXTarget: gfx,
		Verdict: Runs,
	}
	if img, node := req.Platform, s.Host.Arch; img != "" && node != "" {
		parts := strings.Split(img, "/")
		if want := platformArch(node); want != "" && len(parts) > 1 && parts[1] != want {
			r.fail(fmt.Sprintf("the image is built for %s; this node is %s", img, node),
				fmt.Sprintf("use an image (or a multi-platform index) that has linux/%s", want))
		}
	}
	switch g.Vendor {
	case snapshot.VendorNVIDIA:
		checkNVIDIA(req, s, c, cc, k, r)
	case snapshot.VendorAMD:
		checkAMD(req, s, c, gfx, k, r)
	default:
		r.fail(fmt.Sprintf("kiln knows no container GPU stack for %s GPUs", firstNonEmpty(g.Vendor, "unknown-vendor")), "")
	}
	if len(r.Reasons) == 0 {
		r.Reasons = []string{"the image has no GPU requirement kiln recognises (no CUDA or ROCm version, library, framework or GPU code)"}
	}
	return *r
}

func platformArch(uname string) string {
	switch strings.ToLower(uname) {
	case "x86_64", "amd64":
		return "amd64"
	case "aarch64", "arm64":
		return "arm64"
	case "ppc64le":
		return "ppc64le"
	}
	return ""
}

func (r *GPUReport) set(v Verdict, reason, fix string) {
	r.Verdict = worse(r.Verdict, v)
	if reason != "" {
		r.Reasons = append(r.Reasons, reason)
	}
	if fix != "" {
		r.Fix = append(r.Fix, fix)
	}
}

func (r *GPUReport) fail(reason, fix string) { r.set(Fails, reason, fix) }

// unknown records a fact kiln lacks and how to give it.
func (r *GPUReport) unknown(reason, fix string) { r.set(Unknown, reason, fix) }
func (r *GPUReport) note(reason string)         { r.set(Runs, reason, "") }
