//go:build !agentonly

package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/units"
)

func init() { addCommand(newLeaseCmd) }

// sizeFlags describe what a lease asks for.
type sizeFlags struct {
	project     string
	name        string
	gpus        int
	fraction    float64
	mem         string
	mig         string
	priority    int
	preemptible bool
	timeLimit   time.Duration
	c           api.Constraints
	minMem      string
	require     []string
	placement   string
}

func (f *sizeFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVarP(&f.project, "project", "p", "", "project to charge (default: your only project, or the configuration's)")
	fl.StringVar(&f.name, "name", "", "a name for the lease")
	fl.IntVar(&f.gpus, "gpus", 0, "whole GPUs (default 1 when no --fraction or --mig)")
	fl.Float64Var(&f.fraction, "fraction", 0, "a share of one GPU, 0 < F < 1; isolation is MIG, MPS or time-slicing, whichever is strongest there")
	fl.StringVar(&f.mem, "mem", "", "GPU memory for a fraction: 20G, 512M (default: the compute share of the GPU's memory)")
	fl.StringVar(&f.mig, "mig", "", "an existing MIG instance: a profile (1g.10gb) or a MIG device UUID")
	fl.IntVar(&f.priority, "priority", 0, "priority inside the project, -1000..1000; a higher one may preempt preemptible leases")
	fl.BoolVar(&f.preemptible, "preemptible", false, "the lease may be stopped for a higher-priority one (after a notice and a grace period)")
	fl.DurationVar(&f.timeLimit, "time-limit", 0, "the lease ends after this long (default: the server's)")
	fl.StringVar(&f.c.Vendor, "vendor", "", "GPU vendor: nvidia, amd or intel")
	fl.StringVar(&f.c.Model, "model", "", "GPU model contains this (H100, MI300X, L40S)")
	fl.StringVar(&f.c.Architecture, "arch", "", "GPU architecture (hopper, ada, cdna3)")
	fl.StringVar(&f.minMem, "min-memory", "", "least memory per GPU: 40G")
	fl.StringVar(&f.c.MinComputeCapability, "min-cc", "", "least CUDA compute capability: 8.0")
	fl.StringVar(&f.c.MinDriver, "min-driver", "", "least driver version: 535.104")
	fl.StringVar(&f.c.MinCUDA, "min-cuda", "", "the driver must support this CUDA version: 12.2")
	fl.BoolVar(&f.c.SameNVLinkIsland, "same-nvlink", false, "all GPUs in one NVLink (or xGMI) island")
	fl.BoolVar(&f.c.SameNUMA, "same-numa", false, "all GPUs on one NUMA node")
	fl.BoolVar(&f.c.Gang, "gang", false, "the GPUs may come from several nodes, all granted at once (the job runs once per node)")
	fl.StringSliceVar(&f.c.Nodes, "node", nil, "only on these nodes (repeatable)")
	fl.StringVar(&f.placement, "placement", "", "who picks the GPUs: kiln (the default), or scheduler: on kiln server --backend kubernetes, kiln picks the node and when the lease runs and the kube-scheduler picks the GPUs there among those that meet the constraints (whole GPUs, with kiln run --image)")
	fl.StringSliceVar(&f.require, "require", nil, "what the jobs must get from the node's sandbox, else the lease is refused: own-user, pid-namespace, mount-namespace, cgroup, devices (repeatable)")
}

func (f *sizeFlags) request(cfg *api.ClientConfig) (api.LeaseRequest, error) {
	r := api.LeaseRequest{Project: f.project, Name: f.name, GPUs: f.gpus, Fraction: f.fraction, MIG: f.mig,
		Priority: f.priority, Preemptible: f.preemptible, Constraints: f.c, TimeLimitSeconds: int(f.timeLimit / time.Second), Require: f.require, Placement: f.placement}
	if f.timeLimit > 0 && r.TimeLimitSeconds == 0 {
		r.TimeLimitSeconds = 1
	}
	if r.Project == "" && cfg != nil {
		r.Project = cfg.Project
	}
	if r.GPUs == 0 && r.Fraction == 0 && r.MIG == "" {
		r.GPUs = 1
	}
	if err := finiteFlag("--fraction", r.Fraction); err != nil {
		return r, err
	}
	var err error
	if f.mem != "" {
		if r.MemoryBytes, err = parseSize(f.mem); err != nil {
			return r, fmt.Errorf("--mem: %w", err)
		}
	}
	if f.minMem != "" {
		if r.Constraints.MinMemoryBytes, err = parseSize(f.minMem); err != nil {
			return r, fmt.Errorf("--min-memory: %w", err)
		}
	}
	return r, nil
}

// parseSize reads 20G, 512M, 80GiB, or bytes.
func parseSize(s string) (uint64, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "B"), "I")
	mult := uint64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult > 1 {
			t = t[:len(t)-1]
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v <= 0 || math.IsInf(v, 0) || v*float64(mult) >= 1<<64 {
		return 0, fmt.Errorf("%q is not a size such as 20G or 512M", s)
	}
	return uint64(v * float64(mult)), nil
}

// waitGranted follows a lease until it is granted or final, showing its
// queue position and estimated start on a terminal.
func waitGranted(ctx context.Context, c *api.Client, l *api.Lease, progress io.Writer, tty bool) (*api.Lease, error) {
	shown := ""
	defer func() {
		if tty && shown != "" {
			fmt.Fprint(progress, "\r\x1b[K")
		}
	}()
	for l.State == api.LeaseQueued {
		if tty {
			line := fmt.Sprintf("%s: queued, position %d", l.ID, l.QueuePosition)
			if l.EstimatedStart != nil {
				line += fmt.Sprintf(", estimated start %s (in %s)", l.EstimatedStart.Local().Format("15:04:05"), time.Until(*l.EstimatedStart).Round(time.Second))
			}
			if l.Reason != "" {
				line += " -- " + l.Reason
			}
			line = printable(line)
			if line != shown {
				fmt.Fprintf(progress, "\r\x1b[K%s", line)
				shown = line
			}
		}
		next, err := c.GetLease(ctx, l.ID, api.LeaseWait{Since: api.LeaseVersion(l), For: 10 * time.Second})
		if err != nil {
			if ctx.Err() != nil {
				return l, ctx.Err()
			}
			return l, err
		}
		l = next
	}
	return l, nil
}

func newLeaseCmd() *cobra.Command {
	var cf clientFlags
	var sf sizeFlags
	var noWait bool
	cmd := &cobra.Command{
		Use:   "lease [--gpus N | --fraction F [--mem M] | --mig PROFILE]",
		Short: "Lease GPUs without a job, for a time; run jobs in it with 'kiln run --lease'",
		Long: `kiln lease asks the server for GPUs and waits until they are granted (showing the
queue position and estimated start on a terminal), then prints the lease: the
node, the devices and, for a fraction, the isolation it really gets -- mig
(hardware), mps (enforced thread share and memory limit) or time-slicing (none).

The lease holds the GPUs until 'kiln cancel ID' or its time limit. Jobs run in
it with 'kiln run --lease ID -- CMD'.

Exit codes: 0 granted, 2 refused or ended before it was granted, 3 could not ask.`,
		Example: `  kiln lease --gpus 2 --same-nvlink --time-limit 4h
  kiln lease --fraction 0.25 --mem 20G
  kiln lease --mig 1g.10gb -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, cfg, err := cf.connect()
			if err != nil {
				return err
			}
			req, err := sf.request(cfg)
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			ctx := cmd.Context()
			l, err := c.CreateLease(ctx, req)
			if err != nil {
				return apiErr(err)
			}
			got := l
			if !noWait {
				if got, err = waitGranted(ctx, c, l, cmd.ErrOrStderr(), colorOK(cmd.ErrOrStderr())); err != nil {
					return apiErr(err)
				}
			}
			out := cmd.OutOrStdout()
			if cf.structured() {
				if err := writeStructured(out, cf.format, got); err != nil {
					return &exitError{code: 3, err: err}
				}
			} else {
				writeLeaseText(out, got)
			}
			if got.State != api.LeaseGranted && (noWait && got.State != api.LeaseQueued || !noWait) {
				return &exitError{code: 2}
			}
			return nil
		},
	}
	cf.add(cmd)
	sf.add(cmd)
	cf.addOutput(cmd)
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "print the lease at once, queued or not")
	return cmd
}

func writeLeaseText(w io.Writer, l *api.Lease) {
	fmt.Fprintf(w, "lease %s (%s, project %s): %s\n", printable(l.ID), printable(l.Request.ShortSize()), printable(l.Project), printable(l.State))
	if l.Reason != "" {
		fmt.Fprintf(w, "  %s\n", printable(l.Reason))
	}
	if l.State == api.LeaseQueued {
		fmt.Fprintf(w, "  queue position %d", l.QueuePosition)
		if l.EstimatedStart != nil {
			fmt.Fprintf(w, ", estimated start %s", l.EstimatedStart.Local().Format(time.RFC3339))
		}
		fmt.Fprintln(w)
	}
	for _, a := range l.Allocations {
		for _, d := range a.Devices {
			fmt.Fprintf(w, "  %s %s %s %s", printable(a.Node), printable(d.ID), printable(d.Model), printable(d.PCIAddress))
			if d.Isolation != api.IsolationExclusive {
				fmt.Fprintf(w, "  %d‰ of the GPU, %s, isolation %s", d.MilliGPU, sizeText(d.MemoryBytes), printable(isolationText(d.Isolation)))
			}
			fmt.Fprintln(w)
		}
	}
	for _, p := range l.Ports {
		fmt.Fprintf(w, "  port %d of job %s: %s (kiln forward %s %d)\n", p.Port, printable(p.Job), printable(p.State), printable(l.ID), p.Port)
	}
	if l.EndsAt != nil && l.State == api.LeaseGranted {
		fmt.Fprintf(w, "  ends %s\n", l.EndsAt.Local().Format(time.RFC3339))
	}
}

// finiteFlag refuses NaN and infinities, which no range check catches.
func finiteFlag(name string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return &exitError{code: 3, err: fmt.Errorf("%s %v: want a number", name, v)}
	}
	return nil
}

func isolationText(iso string) string {
	switch iso {
	case api.IsolationMIG:
		return "mig (hardware partition)"
	case api.IsolationMPS:
		return "mps (thread share and enforced memory limit)"
	case api.IsolationTimeSlicing:
		return "time-slicing (no isolation: the GPU is shared in time)"
	}
	return iso
}

// sizeText writes a GPU's memory or a share of it, as measured: GiB to one
// decimal.
func sizeText(b uint64) string {
	if b == 0 {
		return "memory unknown"
	}
	return units.BytesRounded(b, 1)
}
