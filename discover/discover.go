// Package discover builds a Snapshot of the running machine from its live
// sources: PCI sysfs for GPUs of every vendor and the PCIe tree around
// them, procfs for the host, module and toolkit files for the driver stack,
// amdgpu sysfs for AMD GPUs, NVML for NVIDIA GPUs, and the kernel log.
//
// Every path is read under Options.Root, so discovery runs the same on a
// live machine ("/"), on a hand-made test tree, and on a record bundle
// (Record, Replay). A missing piece is a snapshot.Note, not an error.
package discover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"

	"kiln.dev/kiln/kfd"
	"kiln.dev/kiln/kmsg"
	"kiln.dev/kiln/snapshot"
)

// Options control a discovery run.
type Options struct {
	// Root is the directory that stands for "/" (default "/").
	Root string
	// NVMLLib is the path of libnvidia-ml.so; empty lets NVML search the
	// usual places.
	NVMLLib string
	// KernelLog is a file holding kernel log records to read instead of
	// the live log. Empty reads Root/dev/kmsg: the records buffered now,
	// without waiting for new ones.
	KernelLog string
	// SkipNVML turns NVML off.
	SkipNVML bool

	// Set by Replay.
	replay      bool
	arch        string
	collected   time.Time
	noKernelLog bool
	nvml        *NVMLReadings
}

func (o Options) root() string {
	if o.Root == "" {
		return "/"
	}
	return o.Root
}

// runExtra is what a run read besides the snapshot, kept for Record.
type runExtra struct {
	nvml            *NVMLReadings
	kernelLog       []string
	kernelLogRead   bool
	archNotFromFile bool
}

// Run discovers the machine under opts.Root.
func Run(ctx context.Context, opts Options) (*snapshot.Snapshot, error) {
	s, _, err := run(ctx, opts, nil)
	return s, err
}

func run(ctx context.Context, opts Options, rec *recording) (*snapshot.Snapshot, *runExtra, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	r := &reader{root: opts.root(), rec: rec}
	s := snapshot.New()
	s.CollectedAt = time.Now().UTC().Truncate(time.Second)
	if !opts.collected.IsZero() {
		s.CollectedAt = opts.collected
	}
	s.Sources = append(s.Sources, snapshot.Source{Kind: "sysfs", Path: opts.root()})
	extra := &runExtra{}

	readHost(r, s)
	if s.Host.Arch == "" {
		switch {
		case opts.arch != "":
			s.Host.Arch = opts.arch
			extra.archNotFromFile = true
		case !opts.replay && opts.root() == "/":
			s.Host.Arch = goArchName(runtime.GOARCH)
			extra.archNotFromFile = true
		}
	}
	walkPCI(r, s)
	readAMDGPUs(r, s)
	readDrivers(r, s)
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}

	// NVML describes the machine kiln runs on, so it is only asked when
	// discovery reads that machine's root.
	switch {
	case opts.nvml != nil:
		opts.nvml.Apply(s)
		extra.nvml = opts.nvml
	case opts.SkipNVML || opts.replay:
	case !hasVendor(s, snapshot.VendorNVIDIA):
	case opts.root() != "/" && opts.NVMLLib == "":
		note(s, "nvml", "NVML not queried: discovery reads a tree other than this machine's root, and NVML would describe this machine")
	default:
		nv, err := CollectNVML(ctx, opts.NVMLLib)
		switch {
		case errors.Is(err, ErrNoNVML):
			note(s, "nvml", nvmlNote(err))
		case err != nil:
			note(s, "nvml", "NVML: "+err.Error())
		case nv != nil:
			nv.Apply(s)
			extra.nvml = nv
		}
	}

	s = readKFD(r, s)

	if !opts.noKernelLog {
		lines, path, err := readKernelLog(opts, r)
		switch {
		case err != nil:
			note(s, "kmsg", err.Error())
		default:
			extra.kernelLog = lines
			extra.kernelLogRead = true
			s.Sources = append(s.Sources, snapshot.Source{Kind: "kmsg", Path: path})
			log, err := kmsg.Parse(strings.NewReader(strings.Join(lines, "\n")))
			if err != nil {
				note(s, "kmsg", "kernel log: "+err.Error())
				break
			}
			s.Events = append(s.Events, log.Events...)
			if log.Dropped > 0 {
				notef(s, "kmsg", "kernel log: %d further events not kept", log.Dropped)
			}
		}
	}

	finish(s)
	slog.Debug("discovery done", "root", opts.root(), "gpus", len(s.GPUs), "pci", len(s.PCI), "notes", len(s.Notes))
	return s, extra, nil
}

// finish orders GPUs and PCI devices by address and numbers the GPUs.
func finish(s *snapshot.Snapshot) {
	sort.SliceStable(s.GPUs, func(i, j int) bool { return s.GPUs[i].PCIAddress < s.GPUs[j].PCIAddress })
	for i := range s.GPUs {
		s.GPUs[i].Index = i
	}
	sort.SliceStable(s.PCI, func(i, j int) bool { return s.PCI[i].Address < s.PCI[j].Address })
	if s.GPUs == nil {
		s.GPUs = []snapshot.GPU{}
	}
}

func note(s *snapshot.Snapshot, source, msg string) {
	s.Notes = append(s.Notes, snapshot.Note{Source: source, Message: msg})
}

func notef(s *snapshot.Snapshot, source, format string, args ...any) {
	note(s, source, fmt.Sprintf(format, args...))
}

func hasVendor(s *snapshot.Snapshot, vendor string) bool {
	for _, g := range s.GPUs {
		if g.Vendor == vendor {
			return true
		}
	}
	return false
}

// goArchName maps Go's GOARCH to the kernel's machine name (uname -m).
func goArchName(goarch string) string {
	switch goarch {
	case "amd64":
		return "x86_64"
	case "arm64":
		return "aarch64"
	case "386":
		return "i686"
	case "ppc64le":
		return "ppc64le"
	}
	return goarch
}

// maxKernelLogLines bounds the kernel log kept from one read.
const maxKernelLogLines = 200000

// readKernelLog reads the kernel log: opts.KernelLog when set (a file of
// records, one per line), else Root/dev/kmsg without blocking. It returns
// the records' first lines (dictionary continuation lines, which start
// with a space, are dropped) and the path read.
func readKernelLog(opts Options, r *reader) ([]string, string, error) {
	p, shown := opts.KernelLog, opts.KernelLog
	if p == "" {
		p, shown = r.abs("dev/kmsg"), "/dev/kmsg"
	}
	f, err := os.Open(p)
	if err != nil {
		switch {
		case errors.Is(err, fs.ErrPermission):
			return nil, shown, fmt.Errorf("kernel log not read: %s: permission denied (run as root, or set sysctl kernel.dmesg_restrict=0)", shown)
		case errors.Is(err, fs.ErrNotExist):
			return nil, shown, fmt.Errorf("kernel log not read: %s does not exist", shown)
		}
		return nil, shown, fmt.Errorf("kernel log not read: %s: %w", shown, unwrapPath(err))
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, shown, fmt.Errorf("kernel log not read: %s: %w", shown, unwrapPath(err))
	}
	var lines []string
	keep := func(rec string) {
		for _, l := range strings.Split(rec, "\n") {
			if l == "" || strings.HasPrefix(l, " ") || len(lines) >= maxKernelLogLines {
				continue
			}
			lines = append(lines, l)
		}
	}
	if st.Mode().IsRegular() {
		b, err := io.ReadAll(io.LimitReader(f, maxFile))
		if err != nil {
			return nil, shown, fmt.Errorf("kernel log not read: %s: %w", shown, unwrapPath(err))
		}
		keep(string(b))
		return lines, shown, nil
	}
	// /dev/kmsg returns one record per read and would block at the end of
	// the buffer; a short read deadline ends the read there instead.
	buf := make([]byte, 16<<10)
	for len(lines) < maxKernelLogLines {
		if err := f.SetReadDeadline(time.Now().Add(100 * time.Millisecond)); err != nil && !errors.Is(err, os.ErrNoDeadline) {
			return lines, shown, nil
		}
		n, err := f.Read(buf)
		if n > 0 {
			keep(string(buf[:n]))
		}
		switch {
		case err == nil:
		case errors.Is(err, syscall.EPIPE):
			// Records were overwritten while reading; go on with the next.
		case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, io.EOF), errors.Is(err, syscall.EAGAIN):
			return lines, shown, nil
		case errors.Is(err, fs.ErrPermission):
			return nil, shown, fmt.Errorf("kernel log not read: %s: permission denied (run as root, or set sysctl kernel.dmesg_restrict=0)", shown)
		default:
			return lines, shown, nil
		}
	}
	return lines, shown, nil
}

// kfdTopology is where the amdgpu driver publishes the KFD topology.
const kfdTopology = "sys/class/kfd/kfd/topology"

// readKFD reads the KFD topology, when the machine has one, and merges its
// xGMI links, partitions and KFD node ids into s.
func readKFD(r *reader, s *snapshot.Snapshot) *snapshot.Snapshot {
	if !r.exists(kfdTopology + "/nodes") {
		if hasVendor(s, snapshot.VendorAMD) {
			note(s, "kfd", "no KFD topology: /sys/class/kfd/kfd/topology absent (amdgpu not loaded, or no ROCm-capable GPU): xGMI links unknown")
		}
		return s
	}
	if r.rec != nil {
		recordTree(r, kfdTopology, map[string]bool{"caches": true})
	}
	ks, err := kfd.Read(os.DirFS(r.abs(kfdTopology)))
	if err != nil {
		note(s, "kfd", err.Error())
		return s
	}
	// Merge renumbers GPUs and keeps what sysfs read where both have a value.
	ks.Sources = []snapshot.Source{{Kind: kfd.SourceKind, Path: "/" + kfdTopology}}
	m := snapshot.Merge(s, ks)
	m.CollectedAt = s.CollectedAt
	return m
}

// unwrapPath drops the host path from an *fs.PathError, so that a message
// names the file as the machine sees it (/dev/kmsg), not where Root put it.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
