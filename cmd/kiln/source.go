package main

import (
	"context"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/discover"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/source"
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
func (f *sourceFlags) load(ctx context.Context, args []string) (*snapshot.Snapshot, error) {
	return source.Load(ctx, append(append([]string(nil), f.from...), args...), f.options())
}
