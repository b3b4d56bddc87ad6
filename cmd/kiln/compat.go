//go:build !agentonly

package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/compat"
	"kiln.dev/kiln/compat/image"
	"kiln.dev/kiln/discover"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/source"
)

func init() { addCommand(newCompatCmd) }

type compatFlags struct {
	nodes    []string
	insecure bool
	format   string
	cacheDir string
	noCache  bool
}

func newCompatCmd() *cobra.Command {
	var f compatFlags
	cmd := &cobra.Command{
		Use:   "compat IMAGE [--node SNAPSHOT...]",
		Short: "Say whether a container image will run on a node's GPUs, and why, before it starts",
		Long: `kiln compat reads a container image and a node and says, for every GPU, what
will happen when the image runs there:

  runs                      driver and GPU meet every requirement
  runs-with-forward-compat  only through the CUDA forward-compatibility package
                            the image carries (allowed on datacenter GPUs only)
  runs-via-jit              no machine code for this GPU in some library: the
                            driver compiles its PTX at start-up (a delay, kept in
                            the JIT cache; kernels may be slower)
  unknown                   kiln lacks a fact it needs (the GPU's compute
                            capability or gfx target, the driver, a version newer
                            than its tables); it says which and how to give it
  fails                     the container will not start, or the kernels of a
                            library cannot run ("no kernel image is available",
                            hipErrorNoBinaryForGpu, an unsupported PTX version)

Each verdict gives the reasons and the fix in words. "runs" means every file of
the image with GPU code has machine code for the GPU or PTX the driver can
compile; a GPU or driver kiln does not know is never taken as fine.

What kiln reads from the image: NVIDIA_REQUIRE_CUDA (the condition the NVIDIA
container runtime checks at start), CUDA_VERSION, cuDNN/NCCL variables, ROCm
version labels; then from the layers: versioned CUDA and ROCm libraries
(libcudart.so.12.4.127, libcudnn, libnccl, libamdhip64), the CUDA
forward-compatibility package (compat/libcuda.so.*), ROCm's version file,
torch/version.py, TensorFlow's build_info and JAX versions, package databases
(dpkg, apk, rpm) and CUDA's version.json, and the GPU code compiled into every
ELF file whatever its name or mode (libraries, executables, Python and Node.js
extension modules): NVIDIA SASS targets (sm_86, arch-specific sm_90a,
family-specific sm_100f) and PTX with its ISA version from .nv_fatbin, AMD gfx
targets with their features (gfx90a:xnack-, gfx11-generic) from clang offload
bundles (compressed ones too) and code objects, and ROCm kernel files named by
target (Tensile, MIOpen). Where the image's labels and its binaries disagree,
the binaries decide and the disagreement is printed. Files deleted in upper
layers do not count.

IMAGE is a registry reference (credentials come from the docker config,
~/.docker/config.json and its credential helpers), an OCI layout directory
(oci:DIR or a directory), or a 'docker save' tarball (docker-archive:FILE or a
file). For a multi-platform index kiln picks each node's platform (linux/amd64
or linux/arm64, from the node's machine architecture).

Layers are decompressed and read as streams; only the few files kiln needs are
read. What each layer holds is cached by its digest (in memory and under
~/.cache/kiln/compat), so an image that shares its base layers with one already
checked costs almost nothing.

--node takes what 'kiln inventory --from' takes: a Snapshot (kiln inventory -o
json), captures (nvidia-smi -q, rocm-smi, lspci ...; join the files of one node
with commas) or a bundle made by --record. Repeat --node for several nodes.
Without --node kiln checks this machine.

Exit codes:
  0  the image runs on every GPU of every node (possibly with forward
     compatibility or JIT; see the verdicts)
  1  it fails on at least one GPU
  2  it fails on none, but kiln cannot tell for at least one GPU (unknown)
  3  kiln could not decide: image or node unreadable`,
		Example: `  kiln compat nvcr.io/nvidia/pytorch:24.05-py3
  kiln compat registry.local:5000/team/train:1.4 --insecure --node gpu01.json --node gpu02.json
  kiln compat ./train-image.tar --node nvidia-smi-q.txt,lspci-vvv.txt -o json
  kiln compat oci:./layout --node bundle/`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat("-o", f.format, "text", "json", "yaml"); err != nil {
				return err
			}
			return runCompat(cmd.Context(), cmd.OutOrStdout(), args[0], f)
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&f.nodes, "node", nil, "a node to check: a Snapshot JSON file, captures of one node joined by commas, or a bundle made by 'kiln inventory --record'; repeat for several nodes (default: this machine)")
	fl.BoolVar(&f.insecure, "insecure", false, "reach the registry over plain HTTP (or TLS without verification), for air-gapped registries")
	fl.StringVarP(&f.format, "output", "o", "text", "output format: text, json or yaml")
	fl.StringVar(&f.cacheDir, "cache-dir", image.DefaultCacheDir(), "where layer results are cached, by layer digest")
	fl.BoolVar(&f.noCache, "no-cache", false, "read every layer again; keep nothing on disk")
	return cmd
}

func runCompat(ctx context.Context, out io.Writer, ref string, f compatFlags) error {
	var nodes []compat.Node
	if len(f.nodes) == 0 {
		s, err := discover.Run(ctx, discover.Options{Root: "/"})
		if err != nil {
			return &exitError{code: 3, err: fmt.Errorf("discovering this machine: %w", err)}
		}
		kb.Default().Annotate(s)
		nodes = append(nodes, compat.Node{Name: firstOf(s.Host.Hostname, "this machine"), Snapshot: s})
	}
	for _, spec := range f.nodes {
		paths := strings.Split(spec, ",")
		s, err := source.OneMachine(ctx, paths)
		if err != nil {
			return &exitError{code: 3, err: fmt.Errorf("--node %s: %w", spec, err)}
		}
		kb.Default().Annotate(s)
		nodes = append(nodes, compat.Node{Name: firstOf(s.Host.Hostname, filepath.Base(strings.TrimSuffix(paths[0], "/"))), Snapshot: s})
	}

	cache := image.NewCache("")
	if !f.noCache {
		cache = image.NewCache(f.cacheDir)
	}
	// One scan per platform the nodes need.
	byPlatform := map[string]*compat.Requirements{}
	scans := map[string]*image.Result{}
	reqs := make([]*compat.Requirements, len(nodes))
	for i, n := range nodes {
		p := image.PlatformForArch(n.Snapshot.Host.Arch)
		key := p.OS + "/" + p.Architecture
		if byPlatform[key] == nil {
			img, err := image.Open(ctx, ref, image.OpenOptions{Insecure: f.insecure, Platform: &p})
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			res, err := image.Scan(ctx, img, image.ScanOptions{Cache: cache})
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			byPlatform[key] = compat.FromScan(res)
			scans[key] = res
		}
		reqs[i] = byPlatform[key]
	}
	rep := compat.Evaluate(reqs, nodes, kb.Default())
	if f.format == "text" {
		writeCompatText(out, rep, scans)
	} else if err := writeStructured(out, f.format, rep); err != nil {
		return &exitError{code: 3, err: err}
	}
	if c := rep.ExitCode(); c != 0 {
		return &exitError{code: c}
	}
	return nil
}

func firstOf(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

func writeCompatText(w io.Writer, rep *compat.Report, scans map[string]*image.Result) {
	r := rep.Requirements
	if r == nil {
		return
	}
	digest := r.Digest
	if len(digest) > 19 {
		digest = digest[:19] + "…"
	}
	fmt.Fprintf(w, "image %s (%s, %s)\n", printable(r.Image), firstOf(digest, "no digest"), printable(r.Platform))
	var needs []string
	if r.CUDA != "" {
		needs = append(needs, fmt.Sprintf("CUDA %s (%s)", r.CUDA, r.CUDAFrom))
	}
	if r.ROCm != "" {
		needs = append(needs, fmt.Sprintf("ROCm %s (%s)", r.ROCm, r.ROCmFrom))
	}
	if r.CuDNN != "" {
		needs = append(needs, "cuDNN "+r.CuDNN)
	}
	if r.NCCL != "" {
		needs = append(needs, "NCCL "+r.NCCL)
	}
	if r.CompatDriver != "" {
		needs = append(needs, "CUDA forward-compat package "+r.CompatDriver)
	}
	if len(needs) == 0 {
		needs = []string{"no GPU stack found"}
	}
	fmt.Fprintf(w, "  needs:      %s\n", printable(strings.Join(needs, ", ")))
	var fws []string
	for _, fw := range r.Frameworks {
		s := fw.Name + " " + fw.Version
		switch {
		case fw.CUDA != "":
			s += " (CUDA " + fw.CUDA + ")"
		case fw.HIP != "":
			s += " (HIP " + fw.HIP + ")"
		}
		fws = append(fws, strings.TrimSpace(s))
	}
	if len(fws) > 0 {
		fmt.Fprintf(w, "  frameworks: %s\n", printable(strings.Join(fws, ", ")))
	}
	if len(r.SASS)+len(r.PTX)+len(r.GFX) > 0 {
		fmt.Fprintf(w, "  GPU code:   %s (%d binaries)\n", printable(strings.Join(append(append(append([]string{}, r.SASS...), r.PTX...), r.GFX...), " ")), len(r.Binaries))
	}
	for _, c := range r.Conflicts {
		fmt.Fprintf(w, "  note:       %s\n", printable(c))
	}
	keys := make([]string, 0, len(scans))
	for k := range scans {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		s := scans[k]
		cached := 0
		for _, l := range s.Layers {
			if l.Cached {
				cached++
			}
		}
		fmt.Fprintf(w, "  read:       %s: %d layers (%d from cache), %.1f MB in %s\n", k, len(s.Layers), cached,
			float64(s.CompressedBytes)/1e6, s.Elapsed.Round(time.Millisecond))
	}
	for _, n := range rep.Nodes {
		drv := ""
		if n.Driver != "" {
			drv = " (driver " + n.Driver
			if n.DriverCUDA != "" {
				drv += ", CUDA " + n.DriverCUDA
			}
			drv += ")"
		}
		fmt.Fprintf(w, "\nnode %s%s: %s\n", printable(n.Node), printable(drv), strings.ToUpper(string(n.Verdict)))
		for _, reason := range n.Reasons {
			fmt.Fprintf(w, "  - %s\n", printable(reason))
		}
		for _, grp := range groupGPUs(n.GPUs) {
			g := grp.gpus[0]
			arch := firstOf(g.ComputeCapability, g.GFXTarget)
			if arch != "" {
				arch = " (" + arch + ")"
			}
			fmt.Fprintf(w, "  %s %s%s: %s\n", gpuList(grp.gpus), printable(firstOf(g.Model, g.Vendor)), printable(arch), g.Verdict)
			for _, reason := range g.Reasons {
				fmt.Fprintf(w, "      - %s\n", printable(reason))
			}
			for _, fix := range g.Fix {
				fmt.Fprintf(w, "      fix: %s\n", printable(fix))
			}
		}
	}
	switch {
	case rep.AllRun:
		fmt.Fprintln(w, "\nThe image runs on every GPU checked.")
	case rep.AnyFails:
		fmt.Fprintln(w, "\nThe image does not run on every GPU checked.")
	default:
		fmt.Fprintln(w, "\nkiln cannot tell whether the image runs on every GPU checked: see the unknown verdicts.")
	}
}

type gpuGroup struct{ gpus []compat.GPUReport }

// groupGPUs joins GPUs whose verdicts read the same, keeping node order.
func groupGPUs(gs []compat.GPUReport) []gpuGroup {
	var out []gpuGroup
	index := map[string]int{}
	for _, g := range gs {
		key := g.Model + "|" + string(g.Verdict) + "|" + strings.Join(g.Reasons, "|") + "|" + strings.Join(g.Fix, "|")
		if i, ok := index[key]; ok {
			out[i].gpus = append(out[i].gpus, g)
			continue
		}
		index[key] = len(out)
		out = append(out, gpuGroup{gpus: []compat.GPUReport{g}})
	}
	return out
}

func gpuList(gs []compat.GPUReport) string {
	if len(gs) == 1 {
		return fmt.Sprintf("GPU %d", gs[0].Index)
	}
	contiguous := true
	for i := 1; i < len(gs); i++ {
		if gs[i].Index != gs[i-1].Index+1 {
			contiguous = false
		}
	}
	if contiguous {
		return fmt.Sprintf("GPUs %d-%d", gs[0].Index, gs[len(gs)-1].Index)
	}
	var ids []string
	for _, g := range gs {
		ids = append(ids, fmt.Sprint(g.Index))
	}
	return "GPUs " + strings.Join(ids, ",")
}
