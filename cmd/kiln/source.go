package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/capture"
	"kiln.dev/kiln/discover"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

// sourceFlags choose where a Snapshot comes from: the live machine or files.
type sourceFlags struct {
	from      []string
	root      string
	nvmlLib   string
	kernelLog string
	noNVML    bool
}

func (f *sourceFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringArrayVar(&f.from, "from", nil, "read captures instead of the live machine: a file (nvidia-smi in any form and its error output, lspci, rocm-smi, amd-smi, kernel logs and journals, fabric manager log, /proc/modules, kiln snapshot JSON), nvidia-bug-report.log[.gz], an sosreport tarball, a folder or tarball of captures, a KFD topology folder or .tar.gz, or a bundle made by --record; - reads standard input; repeat the flag or list more files after it")
	fl.StringVar(&f.root, "root", "/", "live discovery: the directory that stands for / (a copied sysfs tree)")
	fl.StringVar(&f.nvmlLib, "nvml-lib", "", "live discovery: path of libnvidia-ml.so.1 (default: the loader's search path)")
	fl.StringVar(&f.kernelLog, "kernel-log", "", "live discovery: read kernel log lines from this file instead of /dev/kmsg")
	fl.BoolVar(&f.noNVML, "no-nvml", false, "live discovery: do not load NVML")
}

func (f *sourceFlags) options() discover.Options {
	return discover.Options{Root: f.root, NVMLLib: f.nvmlLib, KernelLog: f.kernelLog, SkipNVML: f.noNVML}
}

// load returns the snapshot the flags name; args are more capture files.
// The catalog completes model names the source left out (KFD and lspci give
// only PCI ids).
func (f *sourceFlags) load(ctx context.Context, args []string) (*snapshot.Snapshot, error) {
	paths := append(append([]string(nil), f.from...), args...)
	var s *snapshot.Snapshot
	var err error
	if len(paths) == 0 {
		s, err = discover.Run(ctx, f.options())
	} else {
		s, err = loadPaths(ctx, paths)
	}
	if err != nil {
		return nil, err
	}
	kb.Default().Annotate(s)
	return s, nil
}

// loadPaths reads captures, snapshot JSON files and record bundles, and
// merges them as one machine. Inputs that look like several machines are
// refused with the reason: merged, they would describe a machine that does
// not exist.
func loadPaths(ctx context.Context, paths []string) (*snapshot.Snapshot, error) {
	parts := loadParts(ctx, paths)
	for _, p := range parts {
		if p.Err != nil {
			return nil, p.Err
		}
	}
	ms := capture.Machines(parts)
	switch len(ms) {
	case 0:
		return nil, errors.New("no capture given")
	case 1:
		return ms[0].Snapshot, nil
	}
	return nil, severalMachines(ms)
}

// severalMachines is the refusal for inputs of more than one machine.
func severalMachines(ms []capture.Machine) error {
	var b strings.Builder
	fmt.Fprintf(&b, "these inputs look like %d machines, not one:", len(ms))
	for _, m := range ms {
		var paths []string
		for _, p := range m.Parts {
			paths = append(paths, p.Path)
		}
		fmt.Fprintf(&b, "\n  %s: %s (%s)", m.Label, strings.Join(paths, ", "), m.Why)
	}
	b.WriteString("\ngive the captures of one machine at a time (kiln doctor audits several machines in one run)")
	return errors.New(b.String())
}

// loadParts reads every path into the captures it holds: record bundles and
// snapshot JSON files whole, everything else through the capture importers.
func loadParts(ctx context.Context, paths []string) []capture.Part {
	var parts []capture.Part
	for _, p := range paths {
		if p == "-" {
			parts = append(parts, capture.Read(ctx, p)...)
			continue
		}
		st, err := os.Stat(p)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				err = fmt.Errorf("%s: no such file or directory", p)
			}
			parts = append(parts, capture.Part{Path: p, Err: err})
			continue
		}
		switch {
		case st.IsDir() && discover.IsBundle(p):
			s, err := discover.Replay(ctx, p)
			if err != nil {
				err = fmt.Errorf("%s: replaying recorded bundle: %w", p, err)
			}
			parts = append(parts, capture.Part{Path: p, Kind: "kiln-record", Bundle: p, Snapshot: s, Err: err})
		case !st.IsDir() && isSnapshotJSON(p):
			s, err := decodeSnapshotFile(p)
			parts = append(parts, capture.Part{Path: p, Kind: "kiln-snapshot", Snapshot: s, Err: err})
		default:
			parts = append(parts, capture.Read(ctx, p)...)
		}
	}
	return parts
}

func decodeSnapshotFile(p string) (*snapshot.Snapshot, error) {
	fh, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	s, err := snapshot.Decode(fh)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return s, nil
}

// isSnapshotJSON peeks for kiln's schema_version key.
func isSnapshotJSON(p string) bool {
	fh, err := os.Open(p)
	if err != nil {
		return false
	}
	defer fh.Close()
	buf := make([]byte, 512)
	n, _ := fh.Read(buf)
	b := buf[:n]
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\n' || b[0] == '\t' || b[0] == '\r') {
		b = b[1:]
	}
	return len(b) > 0 && b[0] == '{' && bytes.Contains(b, []byte(`"schema_version"`))
}
