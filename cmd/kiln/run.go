//go:build !agentonly

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/units"
)

func init() { addCommand(newRunCmd) }

func newRunCmd() *cobra.Command {
	var cf clientFlags
	var sf sizeFlags
	var image, leaseID, workdir string
	var env []string
	var ports []int
	var detach, stdin, tty bool
	cmd := &cobra.Command{
		Use:   "run [--gpus N | --fraction F --mem M | --mig P] [--image REF] [-i] [-t] -- CMD [ARG...]",
		Short: "Run a command on leased GPUs and stream its output",
		Long: `kiln run asks for GPUs, waits for them (showing the queue position and the
estimated start on a terminal), runs the command on the node that got them with
the GPU environment set, and streams its output here. The lease ends with the
command; kiln run exits with the command's exit code.

The job sees only its GPUs: CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES on
NVIDIA, ROCR_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES on AMD, and for an MPS fraction
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT.
KILN_ISOLATION says what isolation it really has (exclusive, mig, mps,
time-slicing); KILN_LEASE_ID, KILN_JOB_ID, KILN_RANK and KILN_WORLD_SIZE are set too.

Ctrl-C cancels the lease and stops the command. With --lease the command runs in
a lease you already hold ('kiln lease').

With -t (a terminal: a PTY on the node, resizes, Ctrl-C and Ctrl-D passed to it)
or -i (this side's input passed), the command runs as a session beside a job
that holds the lease (sleep infinity; with --image the image needs sleep, as any
with coreutils or busybox has), as 'kiln exec' runs one, and the lease is
cancelled when it ends. With --lease, the session runs beside the lease's
running job instead.

Exit codes: the command's own, 2 when the lease was refused or the job did not
end by itself (preempted, expired, lost), 3 when kiln could not ask.`,
		Example: `  kiln run --gpus 1 -- nvidia-smi
  kiln run --gpus 4 --same-nvlink --time-limit 2h -- torchrun --nproc-per-node 4 train.py
  kiln run --fraction 0.5 --mem 20G -- python infer.py
  kiln run --lease l-1a2b3c -- python eval.py
  kiln run --gpus 2 --detach -o json -- ./train.sh
  kiln run --gpus 1 --port 8000 -d -- python -m http.server 8000   # then: kiln forward LEASE 8000
  kiln run -it --gpus 1 -- bash                    # a shell on a GPU node, ended with its lease
  kiln run -it --gpus 2 -- python                  # a REPL with two GPUs
  kiln run -it --image nvcr.io/nvidia/pytorch:24.05-py3 -- bash   # a shell in a container`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 && image == "" {
				return &exitError{code: 3, err: errors.New("give a command after --, or an --image")}
			}
			session := stdin || tty
			if session && (detach || cf.structured()) {
				return &exitError{code: 3, err: errors.New("-i/-t run a command on this side's terminal or input: not with --detach or -o json|yaml")}
			}
			c, cfg, err := cf.connect()
			if err != nil {
				return err
			}
			if session && leaseID != "" {
				return runSessionCmd(cmd, c, leaseID, sessionFlags{}, args, true, tty, 0)
			}
			command := args
			if session {
				args = sessionHolder
			}
			spec := api.JobSpec{Command: args, Image: image, WorkDir: workdir, Env: map[string]string{}, Ports: ports}
			for _, kv := range env {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return &exitError{code: 3, err: fmt.Errorf("--env %q: want KEY=VALUE", kv)}
				}
				spec.Env[k] = v
			}
			if spec.WorkDir == "" && image == "" && isLoopback(cfg.Server) {
				spec.WorkDir, _ = os.Getwd() // the job runs on this machine (not in a container)
			}
			ctx := cmd.Context()
			stderr := cmd.ErrOrStderr()
			tty := colorOK(stderr)
			var l *api.Lease
			var jobID string
			if leaseID != "" {
				j, err := c.AddJob(ctx, leaseID, spec)
				if err != nil {
					return apiErr(err)
				}
				jobID = j.ID
				l = &api.Lease{ID: leaseID}
			} else {
				req, err := sf.request(cfg)
				if err != nil {
					return &exitError{code: 3, err: err}
				}
				req.Job = &spec
				got, err := c.CreateLease(ctx, req)
				if err != nil {
					return apiErr(err)
				}
				l, jobID = got, got.Jobs[0]
				if detach {
					return printRun(cmd.OutOrStdout(), cf.format, l, nil)
				}
				l, err = waitGranted(ctx, c, l, stderr, tty)
				if err != nil {
					return cancelOnInterrupt(c, l.ID, stderr, err)
				}
				if l.State != api.LeaseGranted {
					fmt.Fprintf(stderr, "kiln: lease %s %s: %s\n", printable(l.ID), printable(l.State), printable(l.Reason))
					_ = printRun(cmd.OutOrStdout(), cf.format, l, nil)
					return &exitError{code: 2}
				}
				if tty || !cf.structured() {
					writeGrantLine(stderr, l)
				}
			}
			if session {
				// The session runs beside the holder; its end ends the
				// lease.
				err := runSessionCmd(cmd, c, l.ID, sessionFlags{job: jobID}, command, true, tty, time.Minute)
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				defer cancel()
				if _, cerr := c.CancelLease(cctx, l.ID); cerr != nil {
					fmt.Fprintf(stderr, "kiln: cancelling lease %s: %s\n", printable(l.ID), printable(cerr.Error()))
				}
				return err
			}
			if detach {
				return printRun(cmd.OutOrStdout(), cf.format, l, nil)
			}
			logOut := cmd.OutOrStdout()
			if cf.structured() {
				logOut = stderr
			}
			if err := followLogs(ctx, c, jobID, logOut); err != nil {
				return cancelOnInterrupt(c, l.ID, stderr, err)
			}
			j, err := waitJob(ctx, c, jobID)
			if err != nil {
				return cancelOnInterrupt(c, l.ID, stderr, err)
			}
			if cf.structured() {
				if fin, err := c.GetLease(ctx, l.ID, api.LeaseWait{}); err == nil {
					l = fin
				}
				if err := printRun(cmd.OutOrStdout(), cf.format, l, j); err != nil {
					return err
				}
			}
			return jobExit(j, stderr)
		},
	}
	cf.add(cmd)
	sf.add(cmd)
	fl := cmd.Flags()
	fl.StringVarP(&cf.format, "output", "o", "text", "output format: text (the command's output), json or yaml (the lease and job records; output goes to standard error)")
	fl.StringVar(&image, "image", "", "container image to run (runs where kiln compat says it runs)")
	fl.StringVar(&leaseID, "lease", "", "run in this lease instead of asking for a new one")
	fl.StringVar(&workdir, "workdir", "", "working directory on the node (default: the current one when the server is on this machine)")
	fl.StringArrayVarP(&env, "env", "e", nil, "KEY=VALUE for the job (repeatable)")
	fl.IntSliceVar(&ports, "port", nil, "a TCP port the job listens on, reached with 'kiln forward' (repeatable)")
	fl.BoolVarP(&detach, "detach", "d", false, "print the lease and return at once; follow with 'kiln logs -f'")
	fl.BoolVarP(&stdin, "stdin", "i", false, "pass this side's standard input to the command (runs it as a session, as kiln exec)")
	fl.BoolVarP(&tty, "tty", "t", false, "run the command on a terminal, this side's (implies -i)")
	return cmd
}

func isLoopback(server string) bool {
	u, err := url.Parse(server)
	if err != nil {
		return false
	}
	h := u.Hostname()
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func writeGrantLine(w io.Writer, l *api.Lease) {
	var parts []string
	for _, a := range l.Allocations {
		ids := make([]string, len(a.Devices))
		for i, d := range a.Devices {
			ids[i] = d.ID
		}
		parts = append(parts, a.Node+":"+strings.Join(ids, ","))
	}
	fmt.Fprintf(w, "kiln: lease %s granted %s (isolation %s)\n", printable(l.ID), printable(strings.Join(parts, " ")), printable(l.Isolation))
}

type runRecord struct {
	Lease *api.Lease `json:"lease"`
	Job   *api.Job   `json:"job,omitempty"`
}

func printRun(w io.Writer, format string, l *api.Lease, j *api.Job) error {
	if format == "text" {
		writeLeaseText(w, l)
		return nil
	}
	return writeStructured(w, format, runRecord{Lease: l, Job: j})
}

// cancelOnInterrupt cancels the lease when the user interrupted kiln run.
func cancelOnInterrupt(c *api.Client, id string, stderr io.Writer, err error) error {
	if errors.Is(err, context.Canceled) && id != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, cerr := c.CancelLease(ctx, id); cerr == nil {
			fmt.Fprintf(stderr, "\nkiln: interrupted; lease %s cancelled\n", id)
		}
		return &exitError{code: 130}
	}
	return apiErr(err)
}

// followLogs streams a job's output until the job ends.
func followLogs(ctx context.Context, c *api.Client, jobID string, w io.Writer) error {
	logs, err := c.JobLogs(ctx, jobID, true)
	if err != nil {
		return err
	}
	defer logs.Close()
	err = copyOutput(w, logs, false)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// waitJob waits until a job is final.
func waitJob(ctx context.Context, c *api.Client, id string) (*api.Job, error) {
	for {
		j, err := c.GetJob(ctx, id)
		if err != nil {
			return nil, err
		}
		if api.JobFinal(j.State) {
			return j, nil
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

func jobExit(j *api.Job, stderr io.Writer) error {
	writeGPUUse(stderr, j)
	if j.State != api.JobExited {
		fmt.Fprintf(stderr, "kiln: job %s %s: %s\n", printable(j.ID), printable(j.State), printable(j.Reason))
		return &exitError{code: 2}
	}
	if j.ExitCode != nil && *j.ExitCode != 0 {
		code := *j.ExitCode
		if code < 0 || code > 255 {
			code = 2
		}
		return &exitError{code: code}
	}
	if j.Reason != "" && j.Reason != "exited" {
		fmt.Fprintf(stderr, "kiln: job %s: %s\n", printable(j.ID), printable(j.Reason))
		return &exitError{code: 2}
	}
	return nil
}

// writeGPUUse says what a job's tasks used of their GPUs, where their
// agents measured it.
func writeGPUUse(w io.Writer, j *api.Job) {
	for _, t := range j.Tasks {
		u := t.GPU
		if u == nil || u.Samples == 0 {
			continue
		}
		sm := "no SM figure (the driver samples no process on MIG)"
		if u.MeanSMPercent != nil {
			sm = fmt.Sprintf("mean SM use %.0f%%", *u.MeanSMPercent)
		}
		fmt.Fprintf(w, "kiln: job %s on %s used at most %s of GPU memory, %s (%d samples, every %gs)\n",
			printable(j.ID), printable(t.Node), units.Bytes(u.PeakMemoryBytes), sm, u.Samples, u.SampleSeconds)
	}
}
