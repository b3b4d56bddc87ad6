//go:build !agentonly

package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/plan"
)

func init() { addCommand(newPlanCmd) }

type planFlags struct {
	src          sourceFlags
	nodeFiles    []string
	model        string
	train, infer bool
	gpus, nodes  int
	perNode      int
	gpu          string
	networkGbps  float64
	seq, batch   int
	gen          int
	precision    string
	optimizer    string
	layout       string
	top          int
	noFlash      bool
	output       string
}

func newPlanCmd() *cobra.Command {
	var f planFlags
	cmd := &cobra.Command{
		Use:   "plan --model NAME|config.json [--gpus N] [--train|--infer]",
		Short: "Find the parallelism layouts that fit a model on the GPUs, and how fast each runs",
		Long: `kiln plan estimates, for a model and a set of GPUs, the memory every GPU needs
and the time a training step (or a batch of requests) takes, for every layout of
data (DP), tensor (TP) and pipeline (PP) parallelism, ZeRO/FSDP sharding,
micro-batch and activation recomputation; it prints the fastest that fit, where
their time goes, and why the best one wins.

Hardware comes from a node -- this machine, or captures of one given with --node
or --from -- whose link matrix (kiln topo) decides what each collective costs:
NVLink/NVSwitch or xGMI inside an island, PCIe switches, host bridges and CPU
sockets otherwise. Or name it from the catalog with --gpu. Several nodes are
joined by a network of --network-gbps per GPU (Gb/s per direction; a DGX H100
has one 400 Gb/s NIC per GPU: 400).

The model is a catalog name (kiln plan --model list) or a Hugging Face
config.json. Memory follows the ZeRO paper (weights, gradients, optimizer state
by precision and optimizer, sharded by ZeRO stage or FSDP), Korthikanti et al.
2022 for activations (tensor and sequence parallelism, selective or full
recomputation) and the KV cache for serving, plus 2 GB and 8% for the framework
and fragmentation. Time counts FLOPs (the Megatron-LM formula) at a calibrated
share of the GPU's peak, memory-bound elementwise work, the pipeline bubble and
every collective over the link it crosses. docs/plan-accuracy.md compares the
predictions with published runs.

--layout evaluates one layout instead of searching:
  dp=8,tp=8,pp=4,zero=1,mb=1,recompute=selective
keys: dp, tp, pp, vp (interleaved stages), zero (0-3, 3h = FSDP hybrid),
fsdp (full|hybrid), mb (micro-batch), recompute (none|selective|full), sp.

Exit codes: 0 a plan; 1 nothing fits (the answer says what would); 3 bad input.`,
		Example: `  kiln plan --model llama2-70b --gpu H100-SXM5-80GB --gpus 64 --gpus-per-node 8 --network-gbps 400
  kiln plan --model llama3-8b                       # on this machine's GPUs
  kiln plan --model ./config.json --node snapshot.json --nodes 4 --network-gbps 200
  kiln plan --model llama2-70b --infer --batch 32 --seq 2048 --gen 512 --gpu H100-SXM5-80GB --gpus 8
  kiln plan --model gpt3-175b --gpu A100-SXM4-80GB --gpus 1024 --network-gbps 200 \
            --layout dp=16,tp=8,pp=8,zero=1,mb=1,recompute=selective -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runPlan(cmd, &f)
		},
	}
	f.src.add(cmd)
	fl := cmd.Flags()
	fl.StringArrayVar(&f.nodeFiles, "node", nil, "a node to plan on: a kiln snapshot JSON or capture (same as --from)")
	fl.StringVar(&f.model, "model", "", "catalog model name, or the path of a Hugging Face config.json ('list' prints the catalog)")
	fl.BoolVar(&f.train, "train", false, "plan training (the default)")
	fl.BoolVar(&f.infer, "infer", false, "plan serving: prefill plus token generation")
	fl.IntVar(&f.gpus, "gpus", 0, "GPUs in all (default: the node's GPUs, times --nodes)")
	fl.IntVar(&f.nodes, "nodes", 0, "identical nodes (default: --gpus / GPUs per node)")
	fl.IntVar(&f.perNode, "gpus-per-node", 0, "GPUs per node for a --gpu catalog machine (default 8, or --gpus if fewer)")
	fl.StringVar(&f.gpu, "gpu", "", "plan on catalog GPUs of this model instead of a node ('list' prints them)")
	fl.Float64Var(&f.networkGbps, "network-gbps", 0, "network bandwidth between nodes, Gb/s per GPU per direction")
	fl.IntVar(&f.seq, "seq", 0, "sequence length (training) or prompt length (serving); default: the model's")
	fl.IntVar(&f.batch, "batch", 0, "global batch in sequences (training; default about 4M tokens) or concurrent requests (serving; default 1)")
	fl.IntVar(&f.gen, "gen", 0, "tokens generated per request when serving (default 256)")
	fl.StringVar(&f.precision, "precision", "bf16", "bf16, fp16, fp8, tf32 or fp32")
	fl.StringVar(&f.optimizer, "optimizer", "adamw", "adamw, adam8bit or sgd")
	fl.StringVar(&f.layout, "layout", "", "evaluate this layout instead of searching (dp=8,tp=8,pp=4,zero=1,mb=1,recompute=selective)")
	fl.IntVar(&f.top, "top", 5, "layouts to print")
	fl.BoolVar(&f.noFlash, "no-flash-attention", false, "the framework materialises attention scores (no fused attention kernel)")
	fl.StringVarP(&f.output, "output", "o", "text", "output format: text, json or yaml")
	return cmd
}

func runPlan(cmd *cobra.Command, f *planFlags) error {
	out := cmd.OutOrStdout()
	bad := func(err error) error { return &exitError{code: 3, err: err} }
	if err := checkFormat("-o", f.output, "text", "json", "yaml"); err != nil {
		return err
	}
	if f.model == "list" {
		for _, n := range plan.ModelNames() {
			fmt.Fprintln(out, n)
		}
		return nil
	}
	if f.gpu == "list" {
		for _, n := range plan.GPUNames() {
			fmt.Fprintln(out, n)
		}
		return nil
	}
	if f.model == "" {
		return bad(errors.New("--model is required: a catalog name (kiln plan --model list) or a config.json path"))
	}
	if f.train && f.infer {
		return bad(errors.New("--train and --infer exclude each other"))
	}
	if f.gpus < 0 || f.nodes < 0 || f.perNode < 0 || f.networkGbps < 0 || f.seq < 0 || f.batch < 0 || f.gen < 0 {
		return bad(errors.New("sizes and counts must not be negative"))
	}
	model, err := loadPlanModel(f.model)
	if err != nil {
		return bad(err)
	}
	cluster, err := planCluster(cmd, f)
	if err != nil {
		return bad(err)
	}
	job := plan.Job{Model: model, Mode: plan.ModeTrain, Precision: f.precision, Optimizer: f.optimizer,
		GlobalBatch: f.batch, Seq: f.seq, GenTokens: f.gen, NoFlashAttention: f.noFlash}
	if f.infer {
		job.Mode = plan.ModeInfer
	}
	if job, err = job.Normalize(); err != nil {
		return bad(err)
	}
	if f.layout != "" {
		l, err := plan.ParseLayout(f.layout)
		if err != nil {
			return bad(err)
		}
		if l, err = l.Complete(cluster.GPUs()); err != nil {
			return bad(err)
		}
		e, err := plan.Evaluate(job, cluster, l)
		if err != nil {
			return bad(err)
		}
		if f.output != "text" {
			if err := writeStructured(out, f.output, e); err != nil {
				return bad(err)
			}
		} else {
			writePlanHeader(out, job, cluster, "")
			writeEstimates(out, job, []plan.Estimate{e})
			if !e.Fits {
				fmt.Fprintf(out, "\nDoes not fit: %.1f GB per GPU of %.1f GB.\n", e.MemoryPerGPUBytes/1e9, e.MemoryCapacityBytes/1e9)
			}
		}
		if !e.Fits {
			return &exitError{code: 1}
		}
		return nil
	}
	res, err := plan.Search(job, cluster, plan.SearchOptions{Top: f.top})
	if err != nil {
		return bad(err)
	}
	if f.output != "text" {
		if err := writeStructured(out, f.output, res); err != nil {
			return bad(err)
		}
	} else {
		writePlanText(out, res, cluster)
	}
	if res.Infeasible != "" {
		return &exitError{code: 1}
	}
	return nil
}

func loadPlanModel(name string) (plan.Model, error) {
	if m, ok := plan.ModelByName(name); ok {
		return m, nil
	}
	if st, err := os.Stat(name); err == nil {
		p := name
		if st.IsDir() {
			p = filepath.Join(name, "config.json")
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return plan.Model{}, err
		}
		m, err := plan.ParseHFConfig(b, filepath.Base(filepath.Dir(p)))
		if err != nil {
			return plan.Model{}, fmt.Errorf("%s: %w", p, err)
		}
		return m, nil
	}
	if strings.HasSuffix(name, ".json") {
		return plan.Model{}, fmt.Errorf("%s: no such file or directory", name)
	}
	return plan.Model{}, fmt.Errorf("unknown model %q: give a config.json path or one of %s", name, strings.Join(plan.ModelNames(), ", "))
}

func planCluster(cmd *cobra.Command, f *planFlags) (*plan.Cluster, error) {
	k := kb.Default()
	if f.gpu != "" {
		if len(f.nodeFiles) > 0 || len(f.src.from) > 0 {
			return nil, errors.New("--gpu names catalog hardware; leave out --node/--from, or leave out --gpu")
		}
		gpus, per := f.gpus, f.perNode
		if gpus == 0 {
			if f.nodes == 0 {
				return nil, errors.New("--gpu needs --gpus (or --nodes)")
			}
			if per == 0 {
				per = 8
			}
			gpus = f.nodes * per
		} else if f.nodes > 0 && per == 0 {
			if gpus%f.nodes != 0 {
				return nil, fmt.Errorf("%d GPUs do not split over %d nodes", gpus, f.nodes)
			}
			per = gpus / f.nodes
		}
		return plan.CatalogCluster(f.gpu, gpus, per, f.networkGbps, k)
	}
	src := f.src
	src.from = append(append([]string(nil), f.nodeFiles...), f.src.from...)
	s, err := src.load(cmd.Context(), nil)
	if err != nil {
		return nil, err
	}
	gpus := f.gpus
	if f.nodes > 0 && gpus == 0 {
		one, err := plan.SnapshotCluster(s, k, 0, f.networkGbps)
		if err != nil {
			return nil, err
		}
		gpus = f.nodes * one.GPUsPerNode
	}
	return plan.SnapshotCluster(s, k, gpus, f.networkGbps)
}

func writePlanHeader(w io.Writer, j plan.Job, c *plan.Cluster, extra string) {
	what := "training"
	if j.Mode == plan.ModeInfer {
		what = "serving"
	}
	fmt.Fprintf(w, "kiln plan: %s %s on %s", j.Model.Name, what, c.Source)
	if c.Nodes > 1 {
		fmt.Fprintf(w, ", network %.0f Gb/s per GPU", c.NetworkGBps*8)
	}
	fmt.Fprintln(w)
	if j.Mode == plan.ModeInfer {
		fmt.Fprintf(w, "%d requests of %d prompt + %d generated tokens, %s", j.GlobalBatch, j.Seq, j.GenTokens, j.Precision)
	} else {
		fmt.Fprintf(w, "batch %d x %d tokens, %s, %s", j.GlobalBatch, j.Seq, j.Precision, j.Optimizer)
	}
	fmt.Fprintf(w, "; %.1fB parameters%s\n", j.Model.Params()/1e9, extra)
}

func writePlanText(w io.Writer, res *plan.Result, c *plan.Cluster) {
	writePlanHeader(w, res.Job, c, fmt.Sprintf("; %d layouts searched, %d fit", res.Searched, res.Feasible))
	if res.Infeasible != "" {
		fmt.Fprintf(w, "\nNo layout fits: %s.\n", res.Infeasible)
	} else {
		writeEstimates(w, res.Job, res.Best)
		fmt.Fprintln(w)
		for _, e := range res.Explanation {
			fmt.Fprintln(w, e)
		}
	}
	for _, n := range res.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

func writeEstimates(w io.Writer, j plan.Job, es []plan.Estimate) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if j.Mode == plan.ModeInfer {
		fmt.Fprintln(tw, "#\tlayout\tmem/GPU\tbatch time\ttokens/s\tTTFT\tper token\tprefill\tdecode\tTP comm\tPP comm")
		for i, e := range es {
			b := e.Breakdown
			fmt.Fprintf(tw, "%d\t%s\t%.1f GB\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", i+1, e.LayoutString, e.MemoryPerGPUBytes/1e9,
				plan.FormatSeconds(e.StepTimeS), rate(e.TokensPerS), plan.FormatSeconds(e.TimeToFirstTokenS), plan.FormatSeconds(e.TimePerOutputTokenS),
				pct(b.ComputeS, e.StepTimeS), pct(b.DecodeS, e.StepTimeS), pct(b.TPCommS, e.StepTimeS), pct(b.PPCommS, e.StepTimeS))
		}
	} else {
		fmt.Fprintln(tw, "#\tlayout\tmem/GPU\tstep\ttokens/s\tMFU\tcompute\trecompute\tbubble\tTP comm\tPP comm\tDP comm\toptimizer")
		for i, e := range es {
			b := e.Breakdown
			fmt.Fprintf(tw, "%d\t%s\t%.1f GB\t%s\t%s\t%.0f%%\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", i+1, e.LayoutString, e.MemoryPerGPUBytes/1e9,
				plan.FormatSeconds(e.StepTimeS), rate(e.TokensPerS), 100*e.MFU,
				pct(b.ComputeS, e.StepTimeS), pct(b.RecomputeS, e.StepTimeS), pct(b.BubbleS, e.StepTimeS),
				pct(b.TPCommS, e.StepTimeS), pct(b.PPCommS, e.StepTimeS), pct(b.DPCommS, e.StepTimeS), pct(b.OptimizerS, e.StepTimeS))
		}
	}
	tw.Flush()
	if len(es) > 0 {
		b := es[0].Breakdown
		var links []string
		if b.TPLink != "" {
			links = append(links, "TP over "+b.TPLink)
		}
		if b.PPLink != "" {
			links = append(links, "PP over "+b.PPLink)
		}
		if b.DPLink != "" {
			links = append(links, "DP over "+b.DPLink)
		}
		if len(links) > 0 {
			fmt.Fprintf(w, "(#1: %s)\n", strings.Join(links, "; "))
		}
	}
}

func rate(r float64) string {
	switch {
	case r >= 1e6:
		return fmt.Sprintf("%.2fM", r/1e6)
	case r >= 1e4:
		return fmt.Sprintf("%.0fk", r/1e3)
	}
	return fmt.Sprintf("%.0f", r)
}

func pct(part, total float64) string {
	if part <= 0 || total <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*part/total)
}
