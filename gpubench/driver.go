// Package gpubench measures a node's GPU links and judges each figure
// against the link's rating: host-to-device and device-to-host copies
// (pinned and pageable host memory, on the GPU's own NUMA node and on
// another), device memory bandwidth, peer-to-peer copies in one direction
// and both at once, small-copy latency, and collectives (all-reduce,
// all-gather, reduce-scatter bus bandwidth as nccl-tests computes it).
//
// The measurement logic runs against two interfaces, Driver (a GPU API:
// memory, asynchronous copies on streams, events for timing, peer access)
// and Collectives (NCCL or RCCL). The real implementations live in
// gpubench/cudadrv, gpubench/hip and gpubench/nccl and load their
// libraries at run time; tests drive the logic with a fake that reports
// known timings (gpubench/benchtest). Judging (Judge) is a pure function of
// the figures, the node's Snapshot, its topology matrix and the knowledge
// base.
package gpubench

import (
	"errors"
	"strings"
	"time"

	"kiln.dev/kiln/gpubench/hostmem"
)

// ErrNoDriver is wrapped by the errors of drivers whose library cannot be
// loaded or has no usable GPU: kiln bench then says so and exits with its
// code for "could not run".
var ErrNoDriver = errors.New("no GPU driver")

// NoDriver marks err as one of ErrNoDriver's (errors.Is(err, ErrNoDriver)
// holds) without adding words to its text.
func NoDriver(err error) error { return noDriverError{err} }

type noDriverError struct{ err error }

func (e noDriverError) Error() string   { return e.err.Error() }
func (e noDriverError) Unwrap() []error { return []error{ErrNoDriver, e.err} }

// NotFound words a failure to load a library tried under several names:
// when every name was simply not found, once ("libx.so not found (tried
// a, b)"); otherwise each name with the loader's reason.
func NotFound(names, reasons []string) string {
	const missing = "cannot open shared object file: No such file or directory"
	all := len(reasons) > 0
	for _, r := range reasons {
		all = all && strings.HasSuffix(r, missing)
	}
	if all {
		if len(names) == 1 {
			return names[0] + " not found"
		}
		return names[0] + " not found (tried " + strings.Join(names, ", ") + ")"
	}
	return strings.Join(reasons, "; ")
}

// ErrPlacement is wrapped by AllocHost's error when host memory cannot be
// bound to the NUMA node asked for (no NUMA support, or a container that
// forbids mbind): the run then measures from memory wherever the kernel
// puts it, and says so.
var ErrPlacement = hostmem.ErrPlacement

// Device is one GPU as the driver sees it.
type Device struct {
	// Ordinal is the driver's device number.
	Ordinal int
	Name    string
	// PCI is the canonical PCI address; empty when the driver gave none.
	PCI         string
	MemoryBytes uint64
	// NUMANode is the host NUMA node nearest the GPU; nil when unknown,
	// -1 when the platform reports no affinity.
	NUMANode *int
}

// MemKind is where a buffer lives.
type MemKind int

// Kinds of memory.
const (
	HostPinned MemKind = iota
	HostPageable
	DeviceMemory
)

func (k MemKind) String() string {
	switch k {
	case HostPinned:
		return "pinned"
	case HostPageable:
		return "pageable"
	case DeviceMemory:
		return "device"
	}
	return "memory?"
}

// AnyNode asks for host memory without a NUMA placement.
const AnyNode = -1

// Buffer is memory a driver allocated.
type Buffer struct {
	Kind MemKind
	// Device is the ordinal of the GPU that holds device memory.
	Device int
	// NUMANode is where host memory was placed, AnyNode when not placed.
	NUMANode int
	Bytes    int64
	// Addr is the address in this process (host memory) or the device
	// pointer (device memory).
	Addr uint64
}

// Stream is a queue of asynchronous work on one GPU.
type Stream struct {
	Device int
	Handle uint64
}

// Event marks a point in a stream; two events time the work between them.
type Event struct {
	Device int
	Handle uint64
}

// Driver is the part of a GPU API a benchmark needs. Calls may be made
// from any goroutine, one at a time.
type Driver interface {
	// Name is "cuda" or "hip"; Version the driver's version.
	Name() string
	Version() string
	// Devices lists the GPUs the driver sees.
	Devices() ([]Device, error)
	// HostNUMANodes lists the NUMA nodes host memory can be placed on;
	// empty when the host has no NUMA information.
	HostNUMANodes() []int
	// AllocHost allocates host memory, pinned (page-locked, registered
	// with the driver) or pageable, placed on a NUMA node (AnyNode: not
	// placed).
	AllocHost(bytes int64, pinned bool, numaNode int) (Buffer, error)
	AllocDevice(device int, bytes int64) (Buffer, error)
	Free(b Buffer) error
	NewStream(device int) (Stream, error)
	DestroyStream(s Stream) error
	NewEvent(device int) (Event, error)
	DestroyEvent(e Event) error
	// Copy enqueues a copy of bytes from src to dst on s: host to device,
	// device to host, within a device, or between two devices.
	Copy(dst, src Buffer, bytes int64, s Stream) error
	// Record enqueues e on s; Wait makes s wait for e (which may belong to
	// another device's stream); Sync blocks until e has happened.
	Record(e Event, s Stream) error
	Wait(s Stream, e Event) error
	Sync(e Event) error
	// Elapsed is the time between two events that have happened, both of
	// one device.
	Elapsed(start, end Event) (time.Duration, error)
	// CanAccessPeer says whether device can reach peer's memory directly;
	// EnablePeerAccess turns that on (enabling it twice is no error).
	CanAccessPeer(device, peer int) (bool, error)
	EnablePeerAccess(device, peer int) error
	Close() error
}

// Gater is implemented by drivers that can hold a stream: Gate queues on s
// a wait that lasts until open is called, so the work queued behind it
// starts at once. Only work that never waits for the host may be queued
// behind a gate (not copies from pageable memory, which the host stages).
type Gater interface {
	Gate(s Stream) (open func() error, err error)
}

// Op is a collective operation.
type Op string

// Collective operations.
const (
	AllReduce     Op = "all-reduce"
	AllGather     Op = "all-gather"
	ReduceScatter Op = "reduce-scatter"
)

// Ops lists the collectives measured, in order.
var Ops = []Op{AllReduce, AllGather, ReduceScatter}

// Collectives is a collective communication library (NCCL, RCCL).
type Collectives interface {
	// Name is "nccl" or "rccl"; Version its version.
	Name() string
	Version() string
	// Comms makes one communicator per device, all in this process.
	Comms(devices []int) (Comms, error)
}

// Comms is a set of communicators, one rank per device.
type Comms interface {
	// Ranks is the number of ranks in the whole communicator (more than
	// the local devices when it spans several nodes).
	Ranks() int
	// Launch enqueues op on every local rank at once: rank i reads send[i]
	// and writes recv[i] on streams[i]. count is in float32 elements as
	// the library's call takes it: the buffer for all-reduce, what each
	// rank sends for all-gather, what each rank receives for
	// reduce-scatter.
	Launch(op Op, send, recv []Buffer, count int64, streams []Stream) error
	Close() error
}
