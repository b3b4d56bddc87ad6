//go:build !agentonly

package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/gpubench"
	"kiln.dev/kiln/gpubench/cudadrv"
	"kiln.dev/kiln/gpubench/hip"
	"kiln.dev/kiln/gpubench/hostmem"
	"kiln.dev/kiln/gpubench/nccl"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/source"
	"kiln.dev/kiln/topo"
)

func init() { addCommand(newBenchCmd) }

// Exit codes of kiln bench, documented in its help.
const (
	benchExitOK     = 0
	benchExitBelow  = 1
	benchExitFailed = 2
	benchExitCannot = 3
)

type benchFlags struct {
	src            sourceFlags
	format         string
	record         string
	threshold      float64
	size           string
	collectiveSize string
	repetitions    int
	warmup         int
	gpus           string
	tests          []string
	collective     bool
	driver         string
	cudaLib        string
	hipLib         string
	ncclLib        string
	noProgress     bool
}

func newBenchCmd() *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench [--record FILE] [--from RECORD]",
		Short: "Measure the node's GPU links and collectives, and judge each figure against its rating",
		Long: `kiln bench measures this node's GPUs and puts every figure beside the rating of
its link from kiln topo, with the ratio and a verdict:

  h2d, d2h     host to device and back, from pinned and from pageable host
               memory, placed on the GPU's own NUMA node and on another one;
               rated by the slowest PCIe link between the GPU and its root
               port, per direction (GB/s (uni))
  device       a copy within one GPU: bytes read plus bytes written, rated by
               the catalog's memory bandwidth (GB/s (read+write))
  p2p          one GPU writing into another, every ordered pair, rated by the
               pair's link per direction; p2p-bidi both ways at once, rated
               by both directions added (GB/s (bidi))
  p2p-latency  the time of one 8-byte copy between two GPUs, the copy
               engine's setup included, queued behind a held stream so that
               the host's queuing is not counted (never judged)
  all-reduce, all-gather, reduce-scatter
               with NCCL (NVIDIA) or RCCL (AMD) when installed: bus bandwidth
               as nccl-tests computes it (algorithm bandwidth times 2(n-1)/n
               for all-reduce, (n-1)/n for the others), rated by the slowest
               GPU pair per direction

Each test runs its warm-up runs, then the timed ones (timed with the GPU's own
events); a figure is their median, printed with the slowest and fastest. A
figure under --threshold percent of its rating is below-rating; pageable
memory (copied through the driver's staging buffers) and latency are shown for
reference and never judged. One test runs at a time.

kiln bench uses the CUDA driver (libcuda.so.1) for NVIDIA GPUs and HIP
(libamdhip64) for AMD GPUs, loaded when it runs: the same kiln runs on machines
without them and says so. It allocates memory and copies; it never changes a
GPU's settings.

--record FILE stores the node's Snapshot with the results: 'kiln doctor --from
FILE' then reports bandwidth-below-rating with the likely causes (a downtrained
link, a switch, NUMA placement, P2P disabled by ACS, a virtual machine's
IOMMU), and 'kiln bench --from FILE' prints the results again (judged at
--threshold when given). Inside a lease ('kiln run --gpus 8 -- kiln bench')
it measures the GPUs the lease holds. --collective runs the collectives
alone.

Exit codes:
  0  every judged figure is at or above the threshold
  1  at least one figure is below the threshold of its rating
  2  a test could not run (its error is printed; the others are judged)
  3  kiln bench could not run: no GPU, no driver library (libcuda,
     libamdhip64), bad flags, or a --from input without kiln bench results`,
		Example: `  kiln bench
  kiln bench --record gpu01-bench.json && kiln doctor --from gpu01-bench.json
  kiln bench --tests host,p2p -n 20 --size 1GiB
  kiln bench --collective -o json
  kiln bench --from gpu01-bench.json --threshold 80
  kiln run --gpus 8 -- kiln bench --record bench.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat("-o", f.format, "text", "json", "yaml"); err != nil {
				return err
			}
			if err := checkFormat("--driver", f.driver, "auto", "cuda", "hip"); err != nil {
				return err
			}
			if f.threshold <= 0 || f.threshold > 1000 {
				return &exitError{code: benchExitCannot, err: fmt.Errorf("--threshold %v: want a percentage above 0", f.threshold)}
			}
			if len(f.src.from) > 0 {
				return benchFromFiles(cmd, &f)
			}
			return benchLive(cmd, &f)
		},
	}
	f.src.add(cmd)
	fl := cmd.Flags()
	fl.Lookup("from").Usage = "print results recorded by 'kiln bench --record' (judged again) instead of measuring; more captures of the same machine may be given beside them"
	fl.StringVarP(&f.format, "output", "o", "text", "output format: text, json or yaml")
	fl.StringVar(&f.record, "record", "", "write the node's Snapshot with the results to this file (read it with kiln doctor --from)")
	fl.Float64Var(&f.threshold, "threshold", gpubench.DefaultThresholdPercent, "percent of a link's rating below which a figure is below-rating")
	fl.StringVar(&f.size, "size", "256MiB", "size of one copy in bandwidth tests (4096, 64M, 256MiB, 1G)")
	fl.StringVar(&f.collectiveSize, "collective-size", "256MiB", "buffer size of collectives, as nccl-tests counts it")
	fl.IntVarP(&f.repetitions, "repetitions", "n", 10, "timed runs per test; a figure is their median")
	fl.IntVar(&f.warmup, "warmup", 2, "runs made before the timed ones, not counted")
	fl.StringVar(&f.gpus, "gpus", "", "GPUs to measure, by the driver's numbering (0,1 or 0-3; default all it sees)")
	fl.StringSliceVar(&f.tests, "tests", nil, "test groups to run: "+strings.Join(gpubench.Groups, ", ")+" (default all)")
	fl.BoolVar(&f.collective, "collective", false, "run the collectives alone (all-reduce, all-gather, reduce-scatter)")
	fl.StringVar(&f.driver, "driver", "auto", "GPU API: auto (from the GPUs found), cuda or hip")
	fl.StringVar(&f.cudaLib, "cuda-lib", "", "path of libcuda.so.1 (default: the loader's search path)")
	fl.StringVar(&f.hipLib, "hip-lib", "", "path of libamdhip64.so (default: the loader's search path, then /opt/rocm/lib)")
	fl.StringVar(&f.ncclLib, "nccl-lib", "", "path of libnccl.so.2 or librccl.so (default: the loader's search path)")
	fl.BoolVar(&f.noProgress, "no-progress", false, "do not draw the progress bar on a terminal")
	return cmd
}

// plan turns the flags into a measurement plan.
func (f *benchFlags) plan() (gpubench.Plan, error) {
	p := gpubench.DefaultPlan()
	var err error
	if p.Bytes, err = benchSize(f.size); err != nil {
		return p, fmt.Errorf("--size: %w", err)
	}
	if p.CollectiveBytes, err = benchSize(f.collectiveSize); err != nil {
		return p, fmt.Errorf("--collective-size: %w", err)
	}
	p.Repetitions, p.Warmup = f.repetitions, f.warmup
	for _, t := range f.tests {
		p.Groups = append(p.Groups, strings.TrimSpace(t))
	}
	if f.collective {
		if len(f.tests) > 0 {
			return p, errors.New("--collective and --tests: give one of them")
		}
		p.Groups = []string{gpubench.GroupCollective}
	}
	if f.gpus != "" {
		if p.Devices, err = hostmem.ParseList(f.gpus); err != nil || len(p.Devices) == 0 {
			return p, fmt.Errorf("--gpus %q: want GPU numbers such as 0,1 or 0-3", f.gpus)
		}
	}
	return p, p.Validate()
}

// benchSize reads a copy size as kiln's other flags do (256MiB, 1G,
// 4096), within what a benchmark can use.
func benchSize(s string) (int64, error) {
	v, err := parseSize(s)
	if err != nil {
		return 0, err
	}
	if v < 4 || v > 64<<30 {
		return 0, fmt.Errorf("%q: want 4 bytes to 64 GiB", s)
	}
	return int64(v), nil
}

// benchLibs are the libraries a live run measures through.
type benchLibs struct {
	driver      gpubench.Driver
	collectives gpubench.Collectives
	// collectivesMissing says why there is no collective library.
	collectivesMissing string
}

// openBenchLibs loads the GPU driver (and, when the plan runs collectives,
// NCCL or RCCL) for a live run; tests replace it with fakes.
var openBenchLibs = openRealBenchLibs

func openRealBenchLibs(f *benchFlags, s *snapshot.Snapshot, wantCollectives bool) (*benchLibs, error) {
	order := []string{f.driver}
	if f.driver == "auto" {
		order = []string{"cuda", "hip"}
		nvidia, amd := false, false
		for _, g := range s.GPUs {
			nvidia = nvidia || g.Vendor == snapshot.VendorNVIDIA
			amd = amd || g.Vendor == snapshot.VendorAMD
		}
		if amd && !nvidia {
			order = []string{"hip", "cuda"}
		}
	}
	var errs []error
	for _, name := range order {
		var d gpubench.Driver
		var err error
		flavour := "nccl"
		switch name {
		case "cuda":
			var c *cudadrv.Driver
			if c, err = cudadrv.Open(f.cudaLib); err == nil {
				d = c
			}
		case "hip":
			var h *hip.Driver
			if h, err = hip.Open(f.hipLib); err == nil {
				d = h
			}
			flavour = "rccl"
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		libs := &benchLibs{driver: d}
		if wantCollectives {
			if c, err := nccl.Open(flavour, f.ncclLib); err != nil {
				libs.collectivesMissing = err.Error()
			} else {
				libs.collectives = c
			}
		}
		return libs, nil
	}
	return nil, errors.Join(errs...)
}

// noGPUError explains on stderr why nothing can be measured here.
func noGPUError(stderr io.Writer, s *snapshot.Snapshot, err error) error {
	var b strings.Builder
	if n := len(s.GPUs); n > 0 {
		fmt.Fprintf(&b, "kiln bench: kiln found %d %s on this machine but cannot measure %s:\n", n, pluralS(n, "GPU", "GPUs"), pluralS(n, "it", "them"))
	} else {
		b.WriteString("kiln bench: no GPU to measure on this machine:\n")
		b.WriteString("  PCI bus: no GPU (vendor 10de NVIDIA, 1002 AMD, 8086 Intel; display or 3D controller class)\n")
	}
	for _, line := range strings.Split(err.Error(), "\n") {
		fmt.Fprintf(&b, "  %s\n", line)
	}
	b.WriteString("kiln bench needs a GPU and its driver library (libcuda.so.1 for NVIDIA, libamdhip64 for AMD);\n")
	b.WriteString("to read results recorded on another machine, give them with --from\n")
	fmt.Fprint(stderr, printableLines(b.String()))
	return &exitError{code: benchExitCannot}
}

func benchLive(cmd *cobra.Command, f *benchFlags) error {
	ctx := cmd.Context()
	plan, err := f.plan()
	if err != nil {
		return &exitError{code: benchExitCannot, err: err}
	}
	s, err := f.src.load(ctx, nil)
	if err != nil {
		return &exitError{code: benchExitCannot, err: fmt.Errorf("discovering this machine: %w", err)}
	}
	runsCollectives := len(plan.Groups) == 0
	for _, g := range plan.Groups {
		runsCollectives = runsCollectives || g == gpubench.GroupCollective
	}
	libs, err := openBenchLibs(f, s, runsCollectives)
	if err != nil {
		return noGPUError(cmd.ErrOrStderr(), s, err)
	}
	defer func() {
		if err := libs.driver.Close(); err != nil {
			fmt.Fprintln(cmd.ErrOrStderr(), "kiln: closing the GPU driver: "+printable(err.Error()))
		}
	}()
	out := cmd.OutOrStdout()
	opt := gpubench.Options{Plan: plan, Collectives: libs.collectives, CollectivesMissing: libs.collectivesMissing}
	var bar *progressBar
	if f.format == "text" && !f.noProgress && isTerminal(out) {
		bar = &progressBar{w: out, width: terminalWidth()}
		opt.Progress = bar.update
	}
	ms, _, err := gpubench.Run(ctx, libs.driver, opt)
	if bar != nil {
		bar.clear()
	}
	stopped := false
	switch {
	case err != nil && ms == nil && errors.Is(err, gpubench.ErrNoDriver):
		return noGPUError(cmd.ErrOrStderr(), s, err)
	case err != nil && ms == nil:
		return &exitError{code: benchExitCannot, err: err}
	case err != nil:
		stopped = true
		ms.Notes = append(ms.Notes, "stopped before the end: "+err.Error())
	}
	if n, _ := strconv.Atoi(os.Getenv("KILN_WORLD_SIZE")); n > 1 && runsCollectives {
		ms.Notes = append(ms.Notes, fmt.Sprintf("this job is rank %s of a gang of %d: the collectives ran over this node's GPUs only", os.Getenv("KILN_RANK"), n))
	}
	ms.Tool = "kiln bench " + version
	ms.At = time.Now().UTC().Truncate(time.Second)
	m, _ := topo.Build(s, kb.Default())
	gpubench.Judge(ms, s, m, kb.Default(), f.threshold)
	if f.record != "" {
		s.Measurements = ms
		if err := writeRecord(f.record, s); err != nil {
			return &exitError{code: benchExitCannot, err: err}
		}
	}
	if err := writeBench(out, f.format, s.Host.Hostname, ms); err != nil {
		return &exitError{code: benchExitCannot, err: err}
	}
	if f.record != "" && f.format == "text" {
		fmt.Fprintf(out, "\nrecorded in %s: kiln doctor --from %s reports what falls below the rating, with likely causes\n", printable(f.record), printable(f.record))
	}
	if stopped {
		return &exitError{code: benchExitCannot, err: fmt.Errorf("stopped: %w", err)}
	}
	return benchExit(ms)
}

// benchFromFiles prints results recorded earlier, judged again.
func benchFromFiles(cmd *cobra.Command, f *benchFlags) error {
	s, err := source.OneMachine(cmd.Context(), f.src.from)
	if err != nil {
		return &exitError{code: benchExitCannot, err: err}
	}
	if s.Measurements == nil {
		return &exitError{code: benchExitCannot, err: errors.New("these inputs hold no kiln bench results: make them with 'kiln bench --record FILE'")}
	}
	kb.Default().Annotate(s)
	threshold := f.threshold
	if !cmd.Flags().Changed("threshold") && s.Measurements.ThresholdPercent > 0 {
		threshold = s.Measurements.ThresholdPercent
	}
	m, _ := topo.Build(s, kb.Default())
	gpubench.Judge(s.Measurements, s, m, kb.Default(), threshold)
	if f.record != "" {
		if err := writeRecord(f.record, s); err != nil {
			return &exitError{code: benchExitCannot, err: err}
		}
	}
	if err := writeBench(cmd.OutOrStdout(), f.format, s.Host.Hostname, s.Measurements); err != nil {
		return &exitError{code: benchExitCannot, err: err}
	}
	return benchExit(s.Measurements)
}

// benchExit is the exit code the verdicts give.
func benchExit(ms *snapshot.Measurements) error {
	code := benchExitOK
	for _, r := range ms.Results {
		switch r.Verdict {
		case snapshot.VerdictFailed:
			code = benchExitFailed
		case snapshot.VerdictBelowRating:
			if code == benchExitOK {
				code = benchExitBelow
			}
		}
	}
	if code == benchExitOK {
		return nil
	}
	return &exitError{code: code}
}

// writeRecord writes the Snapshot with its results, whole or not at all.
func writeRecord(path string, s *snapshot.Snapshot) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, ".kiln-bench-*")
	if err != nil {
		return fmt.Errorf("--record %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if err := snapshot.Encode(tmp, s); err != nil {
		tmp.Close()
		return fmt.Errorf("--record %s: %w", path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("--record %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("--record %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("--record %s: %w", path, err)
	}
	return nil
}

// benchReport is kiln bench's JSON and YAML output.
type benchReport struct {
	Hostname string `json:"hostname,omitempty"`
	*snapshot.Measurements
}

func writeBench(w io.Writer, format, host string, ms *snapshot.Measurements) error {
	if format != "text" {
		return writeStructured(w, format, benchReport{Hostname: host, Measurements: ms})
	}
	writeBenchText(w, host, ms)
	return nil
}

// benchFigure is a figure with its unit and what it counts.
func benchFigure(v float64, direction string) string {
	if v <= 0 {
		return "-"
	}
	num := strconv.FormatFloat(v, 'f', 1, 64)
	if v >= 100 {
		num = strconv.FormatFloat(v, 'f', 0, 64)
	}
	switch direction {
	case "bidi":
		return num + " GB/s (bidi)"
	case "read+write":
		return num + " GB/s (read+write)"
	case "bus":
		return num + " GB/s (bus)"
	}
	return num + " GB/s (uni)"
}

func spreadText(lo, hi float64, unit string) string {
	if lo <= 0 && hi <= 0 {
		return "-"
	}
	prec := 1
	if unit == "us" {
		prec = 2
	}
	return strconv.FormatFloat(lo, 'f', prec, 64) + "-" + strconv.FormatFloat(hi, 'f', prec, 64)
}

func hostMemoryText(m snapshot.Measurement) string {
	if m.Memory == "" {
		return "-"
	}
	switch {
	case m.HostNUMANode == nil:
		return m.Memory + ", not placed"
	case m.HostLocal != nil && *m.HostLocal:
		return fmt.Sprintf("%s, node %d (own)", m.Memory, *m.HostNUMANode)
	}
	return fmt.Sprintf("%s, node %d", m.Memory, *m.HostNUMANode)
}

func writeBenchText(w io.Writer, host string, ms *snapshot.Measurements) {
	if host == "" {
		host = "node"
	}
	gpus := map[string]bool{}
	reps, warm := 0, 0
	for _, r := range ms.Results {
		for _, d := range r.Devices {
			gpus[d] = true
		}
		reps, warm = max(reps, r.Repetitions), max(warm, r.Warmup)
	}
	fmt.Fprintf(w, "%s: %d %s measured through %s %s", printable(host), len(gpus), pluralS(len(gpus), "GPU", "GPUs"), printable(ms.Driver), printable(ms.DriverVersion))
	if ms.Collectives != "" {
		fmt.Fprintf(w, ", collectives through %s", printable(ms.Collectives))
	}
	fmt.Fprintf(w, "\nmedian of %d timed runs after %d warm-up; below %s%% of its rating a figure is below-rating\n\n", reps, warm, fmtPct(ms.ThresholdPercent))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TEST\tLINK\tHOST MEMORY\tSIZE\tMEASURED\tMIN-MAX\tRATED\tRATIO\tVERDICT")
	// Ratings are listed once per basis, with the links rated by it.
	var bases []string
	seen := map[string][]string{}
	below, failed := 0, 0
	for _, r := range ms.Results {
		measured := benchFigure(r.MedianGBps, r.Direction)
		spread := spreadText(r.MinGBps, r.MaxGBps, "GB/s")
		if r.Test == gpubench.TestP2PLatency {
			measured, spread = "-", "-"
			if r.MedianUS > 0 {
				measured = strconv.FormatFloat(r.MedianUS, 'f', 2, 64) + " us"
				spread = spreadText(r.MinUS, r.MaxUS, "us")
			}
		}
		if r.Error != "" {
			measured, spread = "-", "-"
		}
		rated, ratio := "-", "-"
		if r.RatedGBps > 0 && r.Test != gpubench.TestP2PLatency {
			rated = benchFigure(r.RatedGBps, r.Direction)
			if r.Ratio > 0 {
				ratio = fmtPct(100*r.Ratio) + "%"
			}
		}
		size := gpubench.SizeText(r.Bytes)
		if r.Copies > 1 {
			size = fmt.Sprintf("%d x %s", r.Copies, size)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", cell(r.Test), cell(r.Link), cell(hostMemoryText(r)), size, measured, spread, rated, ratio, cell(r.Verdict))
		if r.RatedBasis != "" && r.Link != "" {
			if _, ok := seen[r.RatedBasis]; !ok {
				bases = append(bases, r.RatedBasis)
			}
			if !slices.Contains(seen[r.RatedBasis], r.Link) {
				seen[r.RatedBasis] = append(seen[r.RatedBasis], r.Link)
			}
		}
		switch r.Verdict {
		case snapshot.VerdictBelowRating:
			below++
		case snapshot.VerdictFailed:
			failed++
		}
	}
	tw.Flush()
	if len(bases) > 0 {
		fmt.Fprintln(w, "\nratings")
		for _, b := range bases {
			fmt.Fprintf(w, "  %s: %s\n", printable(strings.Join(seen[b], ", ")), printable(b))
		}
	}
	if failed > 0 {
		fmt.Fprintln(w, "\nfailed")
		for _, r := range ms.Results {
			if r.Verdict == snapshot.VerdictFailed {
				fmt.Fprintf(w, "  %s %s: %s\n", printable(r.Test), printable(r.Link), printable(r.Error))
			}
		}
	}
	if len(ms.Notes) > 0 {
		fmt.Fprintln(w, "\nnotes")
		for _, n := range ms.Notes {
			fmt.Fprintf(w, "  %s\n", printable(n))
		}
	}
	fmt.Fprintln(w)
	switch {
	case below > 0:
		fmt.Fprintf(w, "%d %s below %s%% of the rating (kiln doctor --from a --record file names the likely causes)\n", below, pluralS(below, "figure is", "figures are"), fmtPct(ms.ThresholdPercent))
	case len(ms.Results) > failed:
		fmt.Fprintf(w, "every judged figure is at or above %s%% of its rating\n", fmtPct(ms.ThresholdPercent))
	}
}

func fmtPct(v float64) string {
	return strconv.FormatFloat(v, 'f', 0, 64)
}

// progressBar draws one line, redrawn in place, on a terminal.
type progressBar struct {
	w     io.Writer
	width int
}

func (p *progressBar) update(done, total int, what string) {
	fmt.Fprint(p.w, "\r"+progressLine(done, total, what, p.width)+"\x1b[K")
}

func (p *progressBar) clear() { fmt.Fprint(p.w, "\r\x1b[K") }

// progressLine is "[#####.....]  12/40  h2d GPU0 pinned (NUMA node 0)",
// cut to width columns.
func progressLine(done, total int, what string, width int) string {
	const barWidth = 24
	filled := 0
	if total > 0 {
		filled = min(barWidth, done*barWidth/total)
	}
	line := fmt.Sprintf("[%s%s] %*d/%d  %s", strings.Repeat("#", filled), strings.Repeat(".", barWidth-filled), len(strconv.Itoa(total)), done, total, printable(what))
	if width > 0 && len(line) > width-1 {
		line = line[:width-1]
	}
	return line
}

// terminalWidth is $COLUMNS, else 80.
func terminalWidth() int {
	if n, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && n > 20 {
		return n
	}
	return 80
}
