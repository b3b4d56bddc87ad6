package frag

import (
	"fmt"
	"strings"
)

// MilliPerGPU is the capacity of one whole GPU in milli-GPU.
const MilliPerGPU = 1000

// Node is the free resources of one node.
type Node struct {
	// Model is the node's GPU model ("" for a node without GPUs).
	Model string
	// CPU is the free CPU in milli-cores.
	CPU int64
	// Memory is the free host memory in MiB.
	Memory int64
	// Free holds the free milli-GPU of each GPU, in device index order
	// (1000 = idle GPU, 0 = fully used).
	Free []int32
}

// FreeGPU is the node's total free milli-GPU.
func (n Node) FreeGPU() int64 {
	var s int64
	for _, f := range n.Free {
		s += int64(f)
	}
	return s
}

// String renders a node compactly, e.g. "G2 cpu=96000 mem=393216 gpu=[1000 190]".
func (n Node) String() string {
	return fmt.Sprintf("%s cpu=%d mem=%d gpu=%v", n.Model, n.CPU, n.Memory, n.Free)
}

// Task is one request as placement sees it: a pod of the trace, a job.
type Task struct {
	// CPU in milli-cores and Memory in MiB.
	CPU    int64
	Memory int64
	// GPUs is the number of GPUs; GPUMilli is the share of each, 1..1000.
	// A fractional (GPU-sharing) task has GPUs == 1 and GPUMilli < 1000.
	// GPUMilli is 0 when GPUs is 0.
	GPUs     int
	GPUMilli int32
	// Models lists the GPU models the task accepts; empty accepts any.
	Models []string
}

// GPUTotal is the task's whole GPU request in milli-GPU.
func (t Task) GPUTotal() int64 { return int64(t.GPUs) * int64(t.GPUMilli) }

// WantsGPU reports whether the task needs any GPU.
func (t Task) WantsGPU() bool { return t.GPUs > 0 && t.GPUMilli > 0 }

// Sharing reports whether the task asks for a fraction of one GPU.
func (t Task) Sharing() bool { return t.GPUs == 1 && t.GPUMilli > 0 && t.GPUMilli < MilliPerGPU }

// Accepts reports whether the task may run on GPUs of the given model.
func (t Task) Accepts(model string) bool {
	if !t.WantsGPU() || len(t.Models) == 0 {
		return true
	}
	for _, m := range t.Models {
		if m == model {
			return true
		}
	}
	return false
}

// String renders a task compactly, e.g. "cpu=4000 mem=8192 gpu=1x470".
func (t Task) String() string {
	s := fmt.Sprintf("cpu=%d mem=%d gpu=%dx%d", t.CPU, t.Memory, t.GPUs, t.GPUMilli)
	if len(t.Models) > 0 {
		s += " model=" + strings.Join(t.Models, "|")
	}
	return s
}

// Fits reports whether task t can be placed on node n now: enough CPU and
// memory, a GPU model it accepts, and enough GPUs with the per-GPU share
// free (whole-GPU tasks need idle GPUs).
func Fits(n Node, t Task) bool {
	if n.CPU < t.CPU || n.Memory < t.Memory {
		return false
	}
	if !t.WantsGPU() {
		return true
	}
	if len(n.Free) == 0 || !t.Accepts(n.Model) {
		return false
	}
	return gpusWith(n.Free, t.GPUMilli) >= t.GPUs
}

// gpusWith counts the GPUs with at least milli free.
func gpusWith(free []int32, milli int32) int {
	c := 0
	for _, f := range free {
		if f >= milli {
			c++
		}
	}
	return c
}

// Apply places task t on node n using the given GPUs and returns the new
// node; n is not changed. It does not check that t fits.
func Apply(n Node, t Task, gpus []int) Node {
	out := n
	out.CPU -= t.CPU
	out.Memory -= t.Memory
	if t.WantsGPU() && len(gpus) > 0 {
		out.Free = append([]int32(nil), n.Free...)
		for _, g := range gpus {
			out.Free[g] -= t.GPUMilli
		}
	}
	return out
}

// FirstFree returns the first k GPUs (by index) with at least milli free, or
// nil when there are fewer. Whole-GPU tasks take idle GPUs this way.
func FirstFree(free []int32, milli int32, k int) []int {
	out := make([]int, 0, k)
	for i, f := range free {
		if len(out) == k {
			break
		}
		if f >= milli {
			out = append(out, i)
		}
	}
	if len(out) < k {
		return nil
	}
	return out
}

// TightestGPU returns the GPU with the least free capacity that still holds
// milli (the first such GPU on ties), or -1.
func TightestGPU(free []int32, milli int32) int {
	best := -1
	for i, f := range free {
		if f >= milli && (best < 0 || f < free[best]) {
			best = i
		}
	}
	return best
}
