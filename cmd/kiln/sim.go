//go:build !agentonly

package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/sim"
)

func init() { addCommand(newSimCmd) }

// defaultTrace is where the Alibaba GPU trace lies, relative to the
// repository root.
const defaultTrace = "../shared/traces/alibaba-gpu-2023"

type simFlags struct {
	trace    string
	pods     string
	policies string
	seeds    string
	ratio    float64
	coverage float64
	mode     string
	format   string
	csvPath  string
	pngPath  string
	workers  int
	speedup  float64
	markdown bool
}

func newSimCmd() *cobra.Command {
	var f simFlags
	cmd := &cobra.Command{
		Use:   "sim [--trace DIR] [--pods NAME] [--policies LIST] [--seeds 42-51]",
		Short: "Replay a GPU cluster trace against placement policies and compare GPU allocation",
		Long: `kiln sim replays Alibaba's GPU cluster trace (cluster-trace-gpu-v2023, the
"openb" trace of Weng et al., "Beware of Fragmentation", USENIX ATC '23) on its
1,213 GPU nodes and compares placement policies by how much of the GPU capacity
they manage to allocate.

Mode "inflate" (the default) is the paper's experiment. For each seed the tasks
are put in a random order, then tasks drawn with replacement are appended until
the GPU request reaches --ratio (1.3) times the cluster's GPU capacity. Tasks
arrive one by one and never leave; a task that fits on no node is dropped. After
each task kiln records the GPU allocation rate (allocated over total milli-GPU),
the fragmentation rate (the share of free GPU capacity that the target workload
cannot use) and the unallocated GPUs, against the arrived workload (the GPU
request submitted so far, in percent of capacity).

Mode "replay" keeps the trace's times: tasks arrive at their creation time, run
as long as they ran in the cluster and leave; a task that does not fit waits in
a queue (first come first served, with backfill: a later task that fits starts
while an earlier one waits). It reports the time-averaged GPU allocation and the
queueing delay per policy (the first --seed fixes the tie-breaking node order).
At its own pace the trace keeps only about 0.2% of the cluster busy (its tasks
are short and spread over five months), so nothing would ever queue: by default
arrivals come 20,000 times faster (--speedup 20000) while each task runs as long
as it did, which takes the cluster to about 90% at its peak; --speedup 1 keeps
the trace's pace.

Policies:
  random      random-fit
  dotprod     Tetris dot product
  clustering  GPU clustering: tasks of one kind together
  packing     GPU packing: shared GPUs, then used nodes, then idle nodes
  bestfit     best fit on CPU and GPU
  fgd         Fragmentation Gradient Descent (the paper's policy)
  kiln        kiln's default policy

The node filter is the paper's: enough free CPU and memory, a GPU model the task
accepts (gpu_spec), and enough GPUs with the per-GPU share free.

The trace is research-use data: kiln reads it from --trace and never copies it.
Cite the paper when you publish results made with it.`,
		Example: `  kiln sim
  kiln sim --policies fgd,kiln --seeds 42-51 -o json
  kiln sim --pods gpushare40 --policies all --seeds 42,43 --csv curve.csv --png alloc.png
  kiln sim --pods all --policies fgd,kiln
  kiln sim --pods all --policies fgd,kiln --markdown
  kiln sim --mode replay --policies bestfit,fgd,kiln`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runSim(cmd, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.trace, "trace", defaultTrace, "folder with the openb node and pod lists (CSV)")
	fl.StringVar(&f.pods, "pods", "default", "pod list(s) to run, by name (default, cpu050, gpushare40, multigpu20, gpuspec33, ...), comma-separated, or all")
	fl.StringVar(&f.policies, "policies", "random,dotprod,clustering,packing,bestfit,fgd,kiln", "policies to compare, comma-separated, or all")
	fl.StringVar(&f.seeds, "seeds", "42-51", "random seeds: a range (42-51) or a list (42,43)")
	fl.Float64Var(&f.ratio, "ratio", 1.3, "inflate: submit tasks until their GPU request is this multiple of the GPU capacity")
	fl.Float64Var(&f.coverage, "coverage", 0.95, "share of tasks the target workload's most popular shapes cover")
	fl.StringVar(&f.mode, "mode", "inflate", "inflate (the paper's experiment) or replay (arrivals and departures in trace time)")
	fl.StringVarP(&f.format, "output", "o", "text", "output format: text, json or yaml")
	fl.StringVar(&f.csvPath, "csv", "", "write the curves (allocation, fragmentation, unallocated GPUs vs arrived workload) to this CSV file")
	fl.StringVar(&f.pngPath, "png", "", "draw the allocation curve of each policy into this PNG file")
	fl.IntVar(&f.workers, "workers", 0, "simulations run at once (0: one per CPU)")
	fl.BoolVar(&f.markdown, "markdown", false, "inflate: write the results as Markdown tables (per pod list; kiln against FGD when several pod lists ran both) with the wall time")
	fl.Float64Var(&f.speedup, "speedup", 20000, "replay: arrivals come this many times faster than in the trace, tasks run as long (1 keeps the trace's pace)")
	return cmd
}

func runSim(cmd *cobra.Command, f simFlags) error {
	out := cmd.OutOrStdout()
	if err := checkFormat("-o", f.format, "text", "json", "yaml"); err != nil {
		return err
	}
	if f.mode != "inflate" && f.mode != "replay" {
		return &exitError{code: 3, err: fmt.Errorf("--mode %s: want inflate or replay", f.mode)}
	}
	policies, err := sim.ParsePolicies(f.policies)
	if err != nil {
		return &exitError{code: 3, err: fmt.Errorf("--policies: %w", err)}
	}
	seeds, err := sim.ParseSeeds(f.seeds)
	if err != nil {
		return &exitError{code: 3, err: fmt.Errorf("--seeds: %w", err)}
	}
	if f.ratio < 0 || f.ratio > 10 {
		return &exitError{code: 3, err: fmt.Errorf("--ratio %g: want a multiple of capacity between 0 and 10", f.ratio)}
	}
	dir := resolveTrace(f.trace, cmd.Flags().Changed("trace"))
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return &exitError{code: 3, err: fmt.Errorf("--trace %s: no such folder; give the folder that holds %s and the openb_pod_list_*.csv files", dir, sim.NodeFile)}
	}
	names, err := podLists(dir, f.pods)
	if err != nil {
		return &exitError{code: 3, err: err}
	}
	if f.markdown && (f.mode != "inflate" || f.format != "text") {
		return &exitError{code: 3, err: errors.New("--markdown: only with --mode inflate and the text output")}
	}
	opt := sim.Options{Ratio: f.ratio, Coverage: f.coverage, Workers: f.workers, Speedup: f.speedup}
	start := time.Now()
	if f.mode == "replay" {
		return runReplay(cmd, f, dir, names, policies, seeds, opt)
	}
	var exps []*sim.Experiment
	for _, name := range names {
		tr, err := sim.LoadTrace(dir, name)
		if err != nil {
			return &exitError{code: 3, err: err}
		}
		ex, err := sim.Simulate(cmd.Context(), tr, policies, seeds, opt)
		if err != nil {
			return &exitError{code: 3, err: err}
		}
		exps = append(exps, ex)
	}
	if err := writeSimFiles(f, exps); err != nil {
		return &exitError{code: 3, err: err}
	}
	if f.markdown {
		return sim.WriteMarkdown(out, exps, time.Since(start))
	}
	if f.format != "text" {
		var rows []sim.Row
		for _, ex := range exps {
			rows = append(rows, ex.Rows()...)
		}
		return writeStructured(out, f.format, rows)
	}
	for i, ex := range exps {
		if i > 0 {
			fmt.Fprintln(out)
		}
		if err := ex.WriteTable(out); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "\n%d simulation(s) in %.1f s\n", len(exps)*len(policies)*len(seeds), time.Since(start).Seconds())
	return nil
}

func runReplay(cmd *cobra.Command, f simFlags, dir string, names, policies []string, seeds []int64, opt sim.Options) error {
	out := cmd.OutOrStdout()
	var all []sim.ReplayResult
	for _, name := range names {
		tr, err := sim.LoadTrace(dir, name)
		if err != nil {
			return &exitError{code: 3, err: err}
		}
		res, err := sim.Replay(cmd.Context(), tr, policies, seeds[0], opt)
		if err != nil {
			return &exitError{code: 3, err: err}
		}
		all = append(all, res...)
	}
	if f.format != "text" {
		return writeStructured(out, f.format, all)
	}
	return sim.WriteReplayTable(out, all)
}

func writeSimFiles(f simFlags, exps []*sim.Experiment) error {
	if f.csvPath != "" {
		if err := writeFile(f.csvPath, func(w io.Writer) error {
			for i, ex := range exps {
				if err := ex.WriteCSV(w, i == 0); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return fmt.Errorf("--csv: %w", err)
		}
	}
	if f.pngPath != "" {
		if len(exps) != 1 {
			return errors.New("--png draws one pod list: give one --pods name")
		}
		if err := exps[0].WritePNG(f.pngPath); err != nil {
			return fmt.Errorf("--png: %w", err)
		}
	}
	return nil
}

func writeFile(path string, write func(io.Writer) error) error {
	fh, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(fh); err != nil {
		fh.Close()
		return err
	}
	return fh.Close()
}

// resolveTrace finds the trace folder: the default is relative to the
// repository root, so it is also looked up from the folders above.
func resolveTrace(dir string, given bool) string {
	if given || filepath.IsAbs(dir) {
		return dir
	}
	if _, err := os.Stat(dir); err == nil {
		return dir
	}
	wd, err := os.Getwd()
	if err != nil {
		return dir
	}
	for d := wd; ; {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return filepath.Join(d, dir)
		}
		up := filepath.Dir(d)
		if up == d {
			return dir
		}
		d = up
	}
}

// podLists expands --pods: names, comma-separated, or all.
func podLists(dir, spec string) ([]string, error) {
	have, err := sim.Variants(dir)
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(spec) == "all" {
		if len(have) == 0 {
			return nil, fmt.Errorf("--pods all: %s holds no openb_pod_list_*.csv", dir)
		}
		return have, nil
	}
	var out []string
	for _, n := range strings.Split(spec, ",") {
		n = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(n), "openb_pod_list_"), ".csv")
		if n == "" {
			continue
		}
		found := false
		for _, h := range have {
			found = found || h == n
		}
		if !found {
			return nil, fmt.Errorf("--pods %s: no %s in %s (have: %s)", n, sim.PodFile(n), dir, strings.Join(have, ", "))
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("--pods: no pod list given")
	}
	return out, nil
}
