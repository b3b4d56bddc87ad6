package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"

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
	fl.StringArrayVar(&f.from, "from", nil, "read captures instead of the live machine: a file (nvidia-smi, lspci, rocm-smi, amd-smi, dmesg, fabric manager log, kiln snapshot JSON), a KFD topology folder or .tar.gz, or a bundle made by --record; repeat the flag or list more files after it, all of one machine")
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
// merges them as one machine.
func loadPaths(ctx context.Context, paths []string) (*snapshot.Snapshot, error) {
	var parts []*snapshot.Snapshot
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("%s: no such file or directory", p)
			}
			return nil, err
		}
		switch {
		case st.IsDir() && discover.IsBundle(p):
			s, err := discover.Replay(ctx, p)
			if err != nil {
				return nil, fmt.Errorf("%s: replaying recorded bundle: %w", p, err)
			}
			parts = append(parts, s)
		case !st.IsDir() && isSnapshotJSON(p):
			fh, err := os.Open(p)
			if err != nil {
				return nil, err
			}
			s, err := snapshot.Decode(fh)
			fh.Close()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			parts = append(parts, s)
		default:
			files = append(files, p)
		}
	}
	if len(files) > 0 {
		s, err := capture.Load(ctx, files...)
		if err != nil {
			return nil, err
		}
		parts = append(parts, s)
	}
	if len(parts) == 1 {
		return parts[0], nil
	}
	return snapshot.Merge(parts...), nil
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
