//go:build !agentonly

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/serving"
	"kiln.dev/kiln/serving/modeldir"
	"kiln.dev/kiln/serving/modelstore"
	"kiln.dev/kiln/units"
)

func init() { addCommand(newServeCmd) }

// serveLogLines is how much of a failed engine's log kiln serve prints.
const serveLogLines = 20

// serveGiveUp: kiln serve ends a deployment whose engine started this many
// times without becoming ready (the server would go on, with backoff).
const serveGiveUp = 3

func newServeCmd() *cobra.Command {
	var cf clientFlags
	var project, name, engine, image, ready, workdir string
	var port, ctxLen, batch, gpus, replicas int
	var process, dryRun, detach, registryInsecure bool
	var wait, timeLimit time.Duration
	cmd := &cobra.Command{
		Use:   "serve MODEL|REGISTRY/REPO:TAG [flags] [-- ENGINE COMMAND...]",
		Short: "Deploy a model behind the server's OpenAI-compatible endpoint",
		Long: `kiln serve deploys a model: it reads the model where it lies (a Hugging Face
style folder of config.json and *.safetensors, or one GGUF file, on storage the
GPU nodes share, at the same path; or a model of the lab's registry, stored with
'kiln model push', which the node's agent pulls into its cache, each file checked
by its digest, before the engine starts), asks the server how its nodes would serve it,
leases those GPUs, starts the engine there and waits until it answers ready.

The server chooses from kiln's engine catalogue (vLLM, SGLang, TGI, llama.cpp's
server): engines that serve the model's format, their images that kiln compat does
not find failing on the node's driver (what kiln compat read of an image decides
over the catalogue's CUDA or ROCm line), and the fewest GPUs of one NVLink or
xGMI island that hold the weights, the KV cache of --batch sequences of --context
tokens and the working set. --dry-run prints that choice and leases nothing.

Your own engine: --image REF (with --port and --ready), or a command after --,
run as a process on the node. In the engine's command kiln fills {model} (the
folder or GGUF file), {model_file} (the GGUF file), {name}, {port}, {tp} (the
GPUs) and {context}. --process runs a catalogue engine's own command on the node,
where it is installed, instead of its image. An engine image sees a model of the
registry read-only at /model, and no other file of the node: a model at a path
is served by engines run there as processes (--process, or your command).

An engine that ends while its deployment is granted is started again by the
server after a backoff (1 s, doubling with each quick failure in a row, at most
5 minutes); ten quick failures in a row end the deployment with the reason.

Once ready, every member of the project reaches the model at
SERVER/openai/v1 (chat/completions, completions, embeddings, models) with their
kiln token as the API key and --name as the model (a name routes inside one
project: who sees it served in several names one in the OpenAI-Project header).
Deployments of one name by one user are replicas (--replicas), taken in turn.
'kiln serve ls' lists deployments with their state and the requests and tokens
routed to them, 'kiln serve usage' the same per project and day; 'kiln serve stop
NAME' ends them; 'kiln serve test NAME' tests one through the endpoint; 'kiln logs
JOB' shows an engine's output.

When the engine does not answer ready within --wait, or exits, kiln serve prints
its last log lines and ends the lease.

Exit codes: 0 ready (or --dry-run, --detach), 2 refused, failed or not ready in
time, 3 when kiln could not ask or the model cannot be read.`,
		Example: `  kiln serve /models/Meta-Llama-3-8B-Instruct
  kiln serve /models/llama-3-70b --name llama-3-70b --context 16384 --batch 16
  kiln serve /models/qwen2.5-7b-q4_k_m.gguf --dry-run
  kiln serve /models/mistral-7b --engine vllm --process
  kiln serve /models/phi-3.gguf --port 9000 -- /opt/bin/llama-server -m {model_file} --port {port} --alias {name}
  kiln serve ls
  kiln serve stop llama-3-70b

  # then, from anywhere that reaches the server:
  curl -H "Authorization: Bearer $KILN_TOKEN" https://gpu-head:7443/openai/v1/chat/completions \
    -d '{"model":"llama-3-70b","messages":[{"role":"user","content":"Hello"}]}'`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var command []string
			if at := cmd.ArgsLenAtDash(); at >= 0 {
				command, args = args[at:], args[:at]
			}
			if len(args) != 1 {
				return &exitError{code: 3, err: errors.New("give one model: a folder with config.json and *.safetensors, or a .gguf file")}
			}
			am, jobModel, source, err := readServeModel(cmd.Context(), args[0], registryInsecure)
			if err != nil {
				return err
			}
			if name == "" {
				name = serving.DefaultName(am.Name)
			}
			if err := serving.CheckName(name); err != nil {
				return &exitError{code: 3, err: fmt.Errorf("--name: %w", err)}
			}
			am.Name = name
			if (image != "" || len(command) > 0) && port == 0 {
				return &exitError{code: 3, err: errors.New("your own engine needs --port, the port it listens on")}
			}
			c, cfg, err := cf.connect()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			stderr := cmd.ErrOrStderr()
			creq := api.ServeChooseRequest{Model: am, Engine: engine, Image: image, Command: command, Port: port,
				Ready: ready, Process: process, Context: ctxLen, Batch: batch, GPUs: gpus}
			if image == "" && len(command) == 0 {
				creq.Ready = "" // the catalogue's
			}
			if replicas < 1 || replicas > 64 {
				return &exitError{code: 3, err: fmt.Errorf("--replicas %d: want 1 to 64", replicas)}
			}
			if project == "" && cfg != nil {
				project = cfg.Project
			}
			// Each replica is a lease of its own; replica i listens on the
			// port after replica i-1's, so that replicas may share a node.
			var leases []*api.Lease
			endAll := func() {
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				defer cancel()
				for _, l := range leases {
					if _, cerr := c.CancelLease(cctx, l.ID); cerr != nil {
						fmt.Fprintf(stderr, "kiln: ending lease %s: %s\n", printable(l.ID), printable(cerr.Error()))
					} else {
						fmt.Fprintf(stderr, "kiln: lease %s ended\n", printable(l.ID))
					}
				}
			}
			basePort := port
			var b api.ServeChoice
			for i := range replicas {
				if i > 0 {
					creq.Port = basePort + i
				}
				choice, err := c.ServeChoose(ctx, creq)
				if err != nil {
					endAll()
					var ae *api.Error
					if errors.As(err, &ae) && ae.Status == 422 {
						return &exitError{code: 2, err: errors.New(printableLines(ae.Message))}
					}
					return apiErr(err)
				}
				if dryRun {
					if cf.structured() {
						return writeStructured(cmd.OutOrStdout(), cf.format, choice)
					}
					writeServeChoice(cmd.OutOrStdout(), source, am, choice)
					return nil
				}
				b = choice.Best
				if i == 0 {
					basePort = b.Port
				}
				fmt.Fprintf(stderr, "kiln: %s on %s: %s\n", printable(name), printable(b.Node), choiceLine(b))
				req := api.LeaseRequest{Project: project, Name: "serve " + name, GPUs: b.GPUs,
					Constraints:      api.Constraints{Nodes: []string{b.Node}, SameNVLinkIsland: b.GPUs > 1},
					TimeLimitSeconds: int(timeLimit / time.Second),
					Job:              &api.JobSpec{Command: b.Command, Image: b.Image, Ports: []int{b.Port}, WorkDir: workdir, Model: jobModel},
					Serve:            &api.ServeSpec{Model: name, Engine: b.Engine, Port: b.Port, Ready: b.Ready, Source: source}}
				if timeLimit > 0 && req.TimeLimitSeconds == 0 {
					req.TimeLimitSeconds = 1
				}
				l, err := c.CreateLease(ctx, req)
				if err != nil {
					endAll()
					return apiErr(err)
				}
				leases = append(leases, l)
			}
			if detach {
				if cf.structured() {
					return writeStructured(cmd.OutOrStdout(), cf.format, api.LeaseList{Leases: derefLeases(leases)})
				}
				for _, l := range leases {
					fmt.Fprintln(cmd.OutOrStdout(), printable(l.ID))
				}
				return nil
			}
			tty := colorOK(stderr)
			for i, l := range leases {
				l, err := waitGranted(ctx, c, l, stderr, tty)
				if err != nil {
					endAll()
					return &exitError{code: 2, err: err}
				}
				if l.State != api.LeaseGranted {
					fmt.Fprintf(stderr, "kiln: lease %s %s: %s\n", printable(l.ID), printable(l.State), printable(l.Reason))
					endAll()
					return &exitError{code: 2}
				}
				fmt.Fprintf(stderr, "kiln: lease %s granted; waiting for %s to answer %s (up to %s)\n", printable(l.ID), printable(b.Engine), printable(b.Ready), wait)
				l, err = waitServing(ctx, c, l, wait, stderr, tty)
				if err != nil {
					if ctx.Err() == nil {
						writeEngineLog(ctx, c, l, stderr)
					}
					endAll()
					return &exitError{code: 2, err: err}
				}
				leases[i] = l
			}
			l := leases[0]
			if len(leases) > 1 {
				if cf.structured() {
					return writeStructured(cmd.OutOrStdout(), cf.format, api.LeaseList{Leases: derefLeases(leases)})
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s is ready, %d replicas taken in turn: %s/openai/v1 (model %q, your kiln token as the API key)\n",
					printable(name), len(leases), printable(strings.TrimRight(cfg.Server, "/")), name)
				return nil
			}
			if cf.structured() {
				return printDeployment(cmd.OutOrStdout(), cf.format, l)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s is ready: %s/openai/v1 (model %q, your kiln token as the API key)\n",
				printable(name), printable(strings.TrimRight(cfg.Server, "/")), name)
			return nil
		},
	}
	cf.add(cmd)
	fl := cmd.Flags()
	fl.StringVarP(&cf.format, "output", "o", "text", "output format: text, json or yaml (the choice with --dry-run, else the lease)")
	fl.StringVarP(&project, "project", "p", "", "project to charge (default: your only project, or the configuration's)")
	fl.StringVar(&name, "name", "", "the name clients ask for in the request's model field (default: the model's folder or file name)")
	fl.StringVar(&engine, "engine", "", "an engine of kiln's catalogue: vllm, sglang, tgi, llama.cpp (default: the best that runs)")
	fl.StringVar(&image, "image", "", "your own engine image (with --port and --ready)")
	fl.IntVar(&port, "port", 0, "the port the engine listens on (your own engine's; default the catalogue engine's)")
	fl.StringVar(&ready, "ready", "/health", "your own engine's readiness path, answered 200 once it serves")
	fl.StringVar(&workdir, "workdir", "", "the engine's working directory on the node (a process's sees only it of the node's /tmp)")
	fl.BoolVar(&process, "process", false, "run the catalogue engine's command on the node, where it is installed, instead of its image")
	fl.IntVar(&ctxLen, "context", 0, "tokens a sequence, prompt and answer (default: the model's, at most 8192)")
	fl.IntVar(&batch, "batch", 0, "sequences served at once, for the KV cache (default 8)")
	fl.IntVar(&gpus, "gpus", 0, "the tensor-parallel degree (default: the fewest GPUs of one NVLink island that hold it)")
	fl.BoolVar(&dryRun, "dry-run", false, "print the engine, image, node and GPUs kiln would take, and lease nothing")
	fl.IntVar(&replicas, "replicas", 1, "deployments of the model under one name, each on GPUs of its own and the port after the last; the endpoint takes them in turn")
	fl.BoolVar(&registryInsecure, "insecure", false, "allow plain HTTP to the model's registry")
	fl.BoolVarP(&detach, "detach", "d", false, "lease and return at once; 'kiln serve ls' shows when it is ready")
	fl.DurationVar(&wait, "wait", 15*time.Minute, "how long the engine has to answer ready (loading weights takes minutes)")
	fl.DurationVar(&timeLimit, "time-limit", 0, "the deployment ends after this long (default: the server's)")
	cmd.AddCommand(newServeLsCmd(), newServeStopCmd(), newServeTestCmd(), newServeTestsCmd(), newServeUsageCmd())
	return cmd
}

// readServeModel reads the model kiln serve is given: a folder or GGUF
// file where it lies, or else a model of the lab's registry (kiln model
// push), whose config says what it is and which the node pulls (the job's
// model, pinned to its digest). source is what the deployment says it
// came from.
func readServeModel(ctx context.Context, arg string, insecure bool) (api.ServeModel, *api.JobModel, string, error) {
	_, statErr := os.Stat(arg)
	if statErr != nil && strings.Contains(arg, "/") && !strings.HasPrefix(arg, "/") && !strings.HasPrefix(arg, ".") {
		a, err := modelstore.Inspect(ctx, arg, modelstore.Options{Insecure: insecure})
		if err != nil {
			return api.ServeModel{}, nil, "", &exitError{code: 3, err: fmt.Errorf("%s is no file here, and as a model of a registry: %s", printable(arg), printable(err.Error()))}
		}
		repo, _, _ := strings.Cut(arg, "@")
		if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
			repo = repo[:i]
		}
		pinned := repo + "@" + a.Digest
		am := a.Config.Model
		am.Ref, am.Path = pinned, ""
		return am, &api.JobModel{Ref: pinned, Digest: a.Digest}, arg, nil
	}
	m, err := modeldir.Read(arg, "")
	if err != nil {
		return api.ServeModel{}, nil, "", &exitError{code: 3, err: err}
	}
	return modelstore.APIModel(m), nil, m.Path, nil
}

func derefLeases(ls []*api.Lease) []api.Lease {
	out := make([]api.Lease, len(ls))
	for i, l := range ls {
		out[i] = *l
	}
	return out
}

func choiceLine(b api.ServeChoice) string {
	image := b.Image
	if image == "" {
		image = "a process on the node"
	}
	return printable(fmt.Sprintf("%s (%s), %d GPU(s) %v over %s, %s of %s a GPU, kiln compat: %s (%s)", b.Engine, image, b.GPUs, b.Island, b.Link,
		units.BytesRounded(uint64(b.MemoryPerGPUBytes), 1), units.BytesRounded(uint64(b.CapacityBytes), 1), b.Verdict, b.VerdictFrom))
}

func writeServeChoice(w io.Writer, source string, m api.ServeModel, r *api.ServeChooseReply) {
	fmt.Fprintf(w, "model %s: %s, %s of weights, from %s\n", printable(m.Name), printable(m.Format), units.BytesRounded(uint64(m.WeightsBytes), 1), printable(source))
	fmt.Fprintf(w, "best: %s on %s\n", choiceLine(r.Best), printable(r.Best.Node))
	fmt.Fprintf(w, "  context %d, batch %d; command: %s\n", r.Best.Context, r.Best.Batch, printable(strings.Join(r.Best.Command, " ")))
	for _, n := range r.Best.Notes {
		fmt.Fprintf(w, "  note: %s\n", printable(n))
	}
	for _, o := range r.Others {
		fmt.Fprintf(w, "also: %s on %s\n", choiceLine(o), printable(o.Node))
	}
	for _, s := range r.Skipped {
		fmt.Fprintf(w, "left out: %s\n", printable(s))
	}
}

// waitServing follows a granted deployment until its engine answers ready,
// its lease ends, or wait passes.
func waitServing(ctx context.Context, c *api.Client, l *api.Lease, wait time.Duration, progress io.Writer, tty bool) (*api.Lease, error) {
	deadline := time.Now().Add(wait)
	start := time.Now()
	shown := ""
	defer func() {
		if tty && shown != "" {
			fmt.Fprint(progress, "\r\x1b[K")
		}
	}()
	jobs := len(l.Jobs)
	// On a terminal, the engine's latest log line (the model's pull, its
	// loading) shows beside the wait.
	var latest atomic.Value
	latest.Store("")
	if tty && len(l.Jobs) > 0 {
		fctx, stopFollow := context.WithCancel(ctx)
		defer stopFollow()
		go followLatest(fctx, c, l.Jobs[len(l.Jobs)-1], &latest)
	}
	for {
		if l.Deployment != nil && l.Deployment.State == api.DeployReady {
			return l, nil
		}
		if len(l.Jobs) > jobs {
			// The engine ended and the server started it again.
			if tty && shown != "" {
				fmt.Fprint(progress, "\r\x1b[K")
				shown = ""
			}
			ended := &api.Lease{Jobs: l.Jobs[:len(l.Jobs)-1]}
			fmt.Fprintf(progress, "kiln: the engine ended before it was ready; the server starts it again as job %s\n", printable(l.Jobs[len(l.Jobs)-1]))
			writeEngineLog(ctx, c, ended, progress)
			if len(l.Jobs) >= serveGiveUp {
				return l, fmt.Errorf("the engine ended %d times before it was ready", len(l.Jobs)-1)
			}
			jobs = len(l.Jobs)
		}
		if api.LeaseFinal(l.State) || l.State == api.LeaseStopping {
			return l, fmt.Errorf("lease %s is %s before its engine was ready: %s", l.ID, l.State, l.Reason)
		}
		left := time.Until(deadline)
		if left <= 0 {
			why := ""
			if l.Deployment != nil && l.Deployment.Reason != "" {
				why = " (last check: " + l.Deployment.Reason + ")"
			}
			return l, fmt.Errorf("the engine did not answer ready in %s%s", wait, why)
		}
		if tty {
			line := fmt.Sprintf("starting, %s", time.Since(start).Round(time.Second))
			if l.Deployment != nil && l.Deployment.Reason != "" {
				line += " -- " + l.Deployment.Reason
			} else if last := latest.Load().(string); last != "" {
				line += " -- " + last
			}
			line = truncText(printable(line), max(terminalWidth()-1, 20))
			if line != shown {
				fmt.Fprintf(progress, "\r\x1b[K%s", line)
				shown = line
			}
		}
		poll := 5 * time.Second
		if tty {
			poll = time.Second // the log line moves on
		}
		next, err := c.GetLease(ctx, l.ID, api.LeaseWait{Since: api.LeaseVersion(l), For: min(left, poll)})
		if err != nil {
			return l, err
		}
		l = next
	}
}

// followLatest keeps the latest line of a job's log in latest until ctx
// ends or the log does.
func followLatest(ctx context.Context, c *api.Client, job string, latest *atomic.Value) {
	rc, err := c.JobLogs(ctx, job, true)
	if err != nil {
		return
	}
	defer rc.Close()
	sc := bufio.NewScanner(rc)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if t := strings.TrimSpace(sc.Text()); t != "" {
			latest.Store(t)
		}
	}
}

// writeEngineLog prints the last lines of the deployment's engine.
func writeEngineLog(ctx context.Context, c *api.Client, l *api.Lease, w io.Writer) {
	if len(l.Jobs) == 0 {
		return
	}
	job := l.Jobs[len(l.Jobs)-1]
	rc, err := c.JobLogs(ctx, job, false)
	if err != nil {
		fmt.Fprintf(w, "kiln: the engine's log (job %s): %s\n", printable(job), printable(err.Error()))
		return
	}
	defer rc.Close()
	lines := tailLines(rc, serveLogLines, 1<<20)
	if len(lines) == 0 {
		fmt.Fprintf(w, "kiln: the engine (job %s) wrote nothing\n", printable(job))
		return
	}
	fmt.Fprintf(w, "kiln: the engine's last %d log lines (kiln logs %s):\n", len(lines), printable(job))
	for _, ln := range lines {
		fmt.Fprintf(w, "  %s\n", printable(ln))
	}
}

// tailLines is the last n lines of r, read through at most limit bytes a
// line.
func tailLines(r io.Reader, n, limit int) []string {
	var out []string
	buf := make([]byte, 32<<10)
	var line bytes.Buffer
	push := func() {
		out = append(out, strings.TrimRight(line.String(), "\r"))
		if len(out) > n {
			out = out[1:]
		}
		line.Reset()
	}
	for {
		k, err := r.Read(buf)
		for _, b := range buf[:k] {
			if b == '\n' {
				push()
			} else if line.Len() < limit {
				line.WriteByte(b)
			}
		}
		if err != nil {
			break
		}
	}
	if line.Len() > 0 {
		push()
	}
	return out
}

func printDeployment(w io.Writer, format string, l *api.Lease) error {
	if format != "" && format != "text" {
		return writeStructured(w, format, l)
	}
	fmt.Fprintf(w, "%s\n", printable(l.ID))
	return nil
}

// deployments are the serving leases the caller sees.
func deployments(ctx context.Context, c *api.Client, project string, all bool) ([]api.Lease, error) {
	ls, err := c.ListLeases(ctx, api.LeaseFilter{Project: project, All: all})
	if err != nil {
		return nil, err
	}
	var out []api.Lease
	for _, l := range ls {
		if l.Request.Serve != nil {
			out = append(out, l)
		}
	}
	return out, nil
}

func newServeLsCmd() *cobra.Command {
	var cf clientFlags
	var project string
	var all bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List model deployments: state, where, and what the endpoint routed to them",
		Long: `kiln serve ls lists the deployments of your projects: the name clients ask for,
its state (queued; starting until its engine answers ready; ready; unready when
a ready engine stops answering; or how its lease ended), the engine and node,
and the requests, errors and tokens the endpoint routed to it since the server
started.`,
		Example: `  kiln serve ls
  kiln serve ls --all -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := cf.connect()
			if err != nil {
				return err
			}
			ds, err := deployments(cmd.Context(), c, project, all)
			if err != nil {
				return apiErr(err)
			}
			if cf.structured() {
				if ds == nil {
					ds = []api.Lease{}
				}
				return writeStructured(cmd.OutOrStdout(), cf.format, api.LeaseList{Leases: ds})
			}
			writeDeploymentTable(cmd.OutOrStdout(), ds)
			return nil
		},
	}
	cf.add(cmd)
	cf.addOutput(cmd)
	cmd.Flags().StringVarP(&project, "project", "p", "", "only this project")
	cmd.Flags().BoolVarP(&all, "all", "a", false, "include ended deployments")
	return cmd
}

func writeDeploymentTable(w io.Writer, ds []api.Lease) {
	if len(ds) == 0 {
		fmt.Fprintln(w, "no deployments")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tENGINE\tWHERE\tREQUESTS\tERRORS\tTOKENS IN/OUT\tLEASE\tPROJECT\tUSER")
	for _, l := range ds {
		sv := l.Request.Serve
		state, where := l.State, ""
		var u api.ServeUsage
		if d := l.Deployment; d != nil && l.State == api.LeaseGranted {
			state, u = d.State, d.Usage
			if d.Reason != "" && d.State != api.DeployReady {
				state += " (" + d.Reason + ")"
			}
		}
		for _, a := range l.Allocations {
			where = fmt.Sprintf("%s:%d GPU(s)", a.Node, len(a.Devices))
		}
		if l.State == api.LeaseQueued {
			where = fmt.Sprintf("queued, position %d", l.QueuePosition)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d/%d\t%s\t%s\t%s\n", cell(sv.Model), cell(state), cell(sv.Engine), cell(where),
			u.Requests, u.Errors, u.PromptTokens, u.CompletionTokens, cell(l.ID), cell(l.Project), cell(l.User))
	}
	tw.Flush()
}

func newServeStopCmd() *cobra.Command {
	var cf clientFlags
	var project string
	cmd := &cobra.Command{
		Use:   "stop NAME|LEASE...",
		Short: "End model deployments (every replica of a name)",
		Long: `kiln serve stop ends the deployments named: every live replica of a name you
serve, or one lease by its id. The engine gets SIGTERM and the server's grace
before it is killed; the endpoint stops routing to it at once.`,
		Example: `  kiln serve stop llama-3-70b
  kiln serve stop l-1a2b3c`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := cf.connect()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			ds, err := deployments(ctx, c, project, false)
			if err != nil {
				return apiErr(err)
			}
			var failed []string
			for _, a := range args {
				n := 0
				for _, l := range ds {
					if l.ID != a && l.Request.Serve.Model != a {
						continue
					}
					n++
					if _, err := c.CancelLease(ctx, l.ID); err != nil {
						failed = append(failed, fmt.Sprintf("%s (%s): %v", a, l.ID, err))
						continue
					}
					fmt.Fprintf(cmd.OutOrStdout(), "%s: lease %s ended\n", printable(l.Request.Serve.Model), printable(l.ID))
				}
				if n == 0 {
					failed = append(failed, fmt.Sprintf("%s: no live deployment of that name or lease (kiln serve ls)", a))
				}
			}
			if len(failed) > 0 {
				return &exitError{code: 2, err: errors.New(printable(strings.Join(failed, "; ")))}
			}
			return nil
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVarP(&project, "project", "p", "", "only this project's deployments")
	return cmd
}
