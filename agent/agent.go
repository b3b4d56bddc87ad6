// Package agent is kiln's node agent: it joins a server with a join token
// (pinning the server's CA), sends the node's Snapshot and the doctor's
// findings at start and whenever they change, heartbeats, runs the jobs the
// server assigns through an executor.Executor, streams their output back
// and reports how they ended. Devices with critical findings are drained
// by the server from what the agent reports.
package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/cdi"
	"kiln.dev/kiln/doctor"
	"kiln.dev/kiln/executor"
	"kiln.dev/kiln/executor/process"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

// Config sets up an agent.
type Config struct {
	Identity *Identity
	// Executor runs jobs that name no image (the process executor).
	Executor executor.Executor
	// Containers runs jobs that name an image (the containerd executor);
	// nil when the node cannot run containers, and NoContainers says why:
	// the server then places no image job here, and one that comes anyway
	// fails to start with that reason.
	Containers   executor.Executor
	NoContainers string
	// CDIDir is where the agent writes the CDI spec of the node's GPUs for
	// container runtimes (cdi.DynamicDir when empty), whenever the GPUs
	// change; only with Containers and GPUs that are not recorded.
	CDIDir string
	// LeftoverGrace is how long a job that a previous run of the agent
	// left running gets between SIGTERM and SIGKILL when the agent starts
	// (default 5s).
	LeftoverGrace time.Duration
	// Discover returns the node's Snapshot (live discovery or a replayed
	// recording).
	Discover func(ctx context.Context) (*snapshot.Snapshot, error)
	// Recorded says the Snapshot replays a recorded machine: its GPUs are
	// not real.
	Recorded bool
	// Heartbeat is the interval between heartbeats (default 5s); keep it a
	// third of the server's heartbeat timeout or less.
	Heartbeat time.Duration
	// Rescan is how often the node is discovered again (default 5 min).
	Rescan time.Duration
	// WorkDir is where jobs without a working directory run.
	WorkDir string
	// Models pulls the models of the lab's registry jobs need (nil: such
	// a job fails to start, saying so).
	Models ModelPuller
	// Metrics is the node's Prometheus endpoint (none without a
	// listener).
	Metrics MetricsConfig
	Logger  *slog.Logger
}

// ModelPuller makes a model of the lab's registry present on the node and
// says where: its folder, and its weights file (GGUF) or "". A model
// pulled is in use, and never evicted, until Release of its digest (once
// for each pull).
type ModelPuller interface {
	PullPinned(ctx context.Context, ref, digest string, progress func(done, total int64)) (dir, file string, err error)
	Release(digest string)
}

// Agent runs on one node.
type Agent struct {
	cfg    Config
	client *api.Client
	log    *slog.Logger
	node   string
	// sandbox is what the process executor gives every job (nil when it
	// does not say).
	sandbox *api.Sandbox

	mu       sync.Mutex
	jobs     map[string]*job // running, or ended with the exit not yet acknowledged
	logsCut  map[string]bool // jobs whose output the server refuses (a log limit)
	done     map[string]bool // ended and acknowledged
	doneList []string
	shape    [32]byte
	snap     *snapshot.Snapshot
	sampled  *snapshot.Snapshot // the last metrics sample (nil without metrics)
	use      map[string]*jobUse // what running jobs used in the samples so far
	// unknownFields are the fields an older server refused; they are left
	// out of what the agent sends from then on.
	unknownFields map[string]bool
	finds         []api.Finding
	wg            sync.WaitGroup
}

type job struct {
	a       api.Assignment
	h       executor.Handle
	stopped string // stop reason, once ordered
	logsEnd chan struct{}
	model   string // the digest of the model it holds in use, once pulled
	// modelDir is that model's folder in the node's cache.
	modelDir string
}

// New makes an agent from its identity.
func New(cfg Config) (*Agent, error) {
	if cfg.Identity == nil || cfg.Executor == nil || cfg.Discover == nil {
		return nil, errors.New("agent: identity, executor and discovery are required")
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 5 * time.Second
	}
	if cfg.Rescan <= 0 {
		cfg.Rescan = 5 * time.Minute
	}
	if cfg.LeftoverGrace <= 0 {
		cfg.LeftoverGrace = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c, err := cfg.Identity.Client()
	if err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, client: c, log: cfg.Logger.With("node", cfg.Identity.Node), node: cfg.Identity.Node,
		jobs: map[string]*job{}, done: map[string]bool{}, logsCut: map[string]bool{}}
	if d, ok := cfg.Executor.(interface{ Delivered() process.Delivered }); ok {
		a.sandbox = sandboxOf(d.Delivered())
		for _, m := range a.sandbox.Missing {
			a.log.Warn("jobs do not get", "what", m)
		}
	}
	return a, nil
}

// sandboxOf is the statement of what jobs get, as the server takes it.
func sandboxOf(d process.Delivered) *api.Sandbox {
	return &api.Sandbox{User: d.User, OwnUser: d.OwnUser, PIDNamespace: d.PIDNamespace, MountNamespace: d.MountNamespace,
		PrivateTmp: d.PrivateTmp, CleanEnv: d.CleanEnv, NoNewPrivs: d.NoNewPrivs, Cgroup: d.Cgroup, Devices: d.Devices,
		Missing: append([]string(nil), d.Missing...)}
}

// Run registers and serves until ctx ends. Jobs keep running while the
// server is unreachable; the agent retries and reconciles when it is back.
// When ctx ends, running jobs are stopped.
//
// Before it registers, the agent stops the jobs a previous run of it left
// running (it crashed or was killed), so that the server, which frees
// their GPUs when the agent says they do not run, never grants GPUs that
// an old job still uses.
func (a *Agent) Run(ctx context.Context) error {
	defer a.client.HTTP.CloseIdleConnections() // after the last exit report
	defer a.stopAll()
	if err := a.reap(ctx); err != nil {
		return err
	}
	if err := a.discover(ctx); err != nil {
		return err
	}
	if a.cfg.Metrics.Listener != nil || a.cfg.Metrics.Sample != nil {
		// The node is sampled (and its metrics served) while the server
		// is unreachable too; sampling stops before the jobs do.
		mctx, stopMetrics := context.WithCancel(ctx)
		defer stopMetrics()
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.serveMetrics(mctx)
		}()
	}
	backoff := 100 * time.Millisecond
	for {
		if err := a.register(ctx); err == nil {
			break
		} else if ctx.Err() != nil {
			return nil
		} else {
			a.log.Warn("register failed; retrying", "err", err)
			if api.StatusOf(err) == 401 || api.StatusOf(err) == 403 {
				return fmt.Errorf("the server refuses this node's certificate: %w (join again with a new join token)", err)
			}
		}
		if !sleep(ctx, backoff) {
			return nil
		}
		backoff = min(backoff*2, 2*time.Second)
	}
	tctx, stopTunnels := context.WithCancel(ctx)
	defer stopTunnels() // before stopAll waits
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		a.runTunnels(tctx)
	}()
	rescan := time.Now().Add(a.cfg.Rescan)
	backoff = 100 * time.Millisecond
	for ctx.Err() == nil {
		if time.Now().After(rescan) {
			rescan = time.Now().Add(a.cfg.Rescan)
			if changed, err := a.rediscover(ctx); err != nil {
				a.log.Warn("discovery failed", "err", err)
			} else if changed {
				if err := a.register(ctx); err != nil {
					a.log.Warn("sending the new snapshot failed", "err", err)
				}
			}
		}
		reply, err := a.beat(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			a.log.Debug("heartbeat failed; retrying", "err", err)
			if !sleep(ctx, backoff) {
				return nil
			}
			backoff = min(backoff*2, a.cfg.Heartbeat)
			continue
		}
		backoff = 100 * time.Millisecond
		if reply.Register {
			if err := a.register(ctx); err != nil {
				a.log.Warn("register failed", "err", err)
			}
		}
		for _, s := range reply.Start {
			a.start(ctx, s)
		}
		for _, s := range reply.Stop {
			a.stop(s)
		}
	}
	return nil
}

// reap stops what the executors' previous runs left.
func (a *Agent) reap(ctx context.Context) error {
	var errs []error
	for _, ex := range []executor.Executor{a.cfg.Executor, a.cfg.Containers} {
		r, ok := ex.(executor.Reaper)
		if !ok || ex == nil {
			continue
		}
		left, err := r.Reap(ctx, a.cfg.LeftoverGrace)
		for _, l := range left {
			if l.Stopped {
				a.log.Warn("stopped a job the agent's previous run left running", "job", l.Job, "lease", l.Lease, "executor", ex.Name())
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s executor: %w", ex.Name(), err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		// Jobs that could not be stopped may still hold GPUs: registering
		// would let the server grant them again.
		return fmt.Errorf("stopping the jobs of the agent's previous run: %w", err)
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (a *Agent) discover(ctx context.Context) error {
	_, err := a.rediscover(ctx)
	return err
}

// rediscover takes a new Snapshot and runs the doctor on it; it reports
// whether the node's shape (GPUs, MIG, drivers, critical findings) changed.
func (a *Agent) rediscover(ctx context.Context) (bool, error) {
	s, err := a.cfg.Discover(ctx)
	if err != nil {
		return false, fmt.Errorf("discovering the node: %w", err)
	}
	var finds []api.Finding
	if rep, err := doctor.Run(ctx, s, kb.Default()); err == nil {
		for _, f := range rep.Findings {
			finds = append(finds, api.Finding{ID: f.ID, Severity: f.Severity.String(), Title: f.Title, Devices: f.Devices, Remedy: f.Remedy})
		}
	}
	shape := shapeOf(s, finds)
	a.mu.Lock()
	changed := shape != a.shape
	a.shape, a.snap, a.finds = shape, s, finds
	a.mu.Unlock()
	if changed {
		a.writeCDI(s)
	}
	return changed, nil
}

// writeCDI writes the CDI spec of the node's GPUs, for the container
// executor to inject them by name.
func (a *Agent) writeCDI(s *snapshot.Snapshot) {
	if a.cfg.Containers == nil || a.cfg.Recorded || len(s.GPUs) == 0 {
		return
	}
	if n, ok := a.cfg.Containers.(interface{ NoCDI() bool }); ok && n.NoCDI() {
		return // the executor's platform injects the GPUs (Kubernetes: the DRA driver)
	}
	res, err := cdi.Generate(s, cdi.Options{})
	if err != nil {
		a.log.Warn("no CDI spec for the node's GPUs: container jobs get no GPU", "err", err)
		return
	}
	for _, n := range res.Notes {
		a.log.Info("CDI spec", "note", n)
	}
	p, err := cdi.Write(res.Spec, a.cfg.CDIDir)
	if err != nil {
		a.log.Warn("writing the CDI spec failed: container jobs get no GPU", "err", err)
		return
	}
	a.log.Debug("CDI spec written", "path", p, "devices", len(res.Devices))
}

func shapeOf(s *snapshot.Snapshot, finds []api.Finding) [32]byte {
	type gpu struct {
		Index      int
		PCI, UUID  string
		Model      string
		Mem        uint64
		MIG        *snapshot.MIG
		Partitions *snapshot.Partition
	}
	v := struct {
		GPUs    []gpu
		Drivers snapshot.Drivers
		Crit    []string
	}{Drivers: s.Drivers}
	for _, g := range s.GPUs {
		v.GPUs = append(v.GPUs, gpu{g.Index, g.PCIAddress, g.UUID, g.Model, g.MemoryTotalBytes, g.MIG, g.Partition})
	}
	for _, f := range finds {
		if f.Severity == "critical" {
			v.Crit = append(v.Crit, fmt.Sprint(f.ID, f.Devices))
		}
	}
	sort.Strings(v.Crit)
	b, _ := json.Marshal(v)
	return sha256.Sum256(b)
}

func (a *Agent) running() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.jobs))
	for id := range a.jobs {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

func (a *Agent) register(ctx context.Context) error {
	a.mu.Lock()
	req := api.RegisterRequest{Snapshot: a.snap, Findings: a.finds, Recorded: a.cfg.Recorded, Executor: a.cfg.Executor.Name(), Sandbox: a.sandbox}
	if a.cfg.Containers != nil {
		req.Containers = a.cfg.Containers.Name()
	} else {
		req.NoContainers = a.cfg.NoContainers
		if req.NoContainers == "" {
			req.NoContainers = "the agent runs no container executor"
		}
	}
	a.mu.Unlock()
	req.Running = a.running()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err := a.client.Register(rctx, a.node, req)
	return err
}

func (a *Agent) beat(ctx context.Context) (api.HeartbeatReply, error) {
	hb := api.Heartbeat{Running: a.running(), WaitMS: int(a.cfg.Heartbeat / time.Millisecond), Open: a.openPorts(ctx), Chosen: a.chosen()}
	if !a.olderServer("samples") {
		hb.Samples = a.samples()
	}
	rctx, cancel := context.WithTimeout(ctx, a.cfg.Heartbeat+10*time.Second)
	defer cancel()
	reply, err := a.client.Heartbeat(rctx, a.node, hb)
	if err != nil && hb.Samples != nil && a.refusesField(err, "samples") {
		hb.Samples = nil
		reply, err = a.client.Heartbeat(rctx, a.node, hb)
	}
	if err != nil {
		return api.HeartbeatReply{}, err
	}
	return *reply, nil
}

// refusesField reports whether err is a server's refusal of a field it
// does not know (a server older than the agent), and then remembers to
// leave the field out from now on.
func (a *Agent) refusesField(err error, field string) bool {
	if api.StatusOf(err) != 400 || !strings.Contains(err.Error(), `unknown field "`+field+`"`) {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.unknownFields == nil {
		a.unknownFields = map[string]bool{}
	}
	if !a.unknownFields[field] {
		a.log.Warn("the server is older than this agent and takes no "+field+": upgrade the server to have them", "field", field)
	}
	a.unknownFields[field] = true
	return true
}

// olderServer reports whether the server refused field before.
func (a *Agent) olderServer(field string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.unknownFields[field]
}

// chosen is, for the jobs whose devices the cluster's scheduler was to
// pick, the IDs of those it picked once known. It is sent in every
// heartbeat while the job runs: the server takes the first and ignores
// the rest.
func (a *Agent) chosen() map[string][]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out map[string][]string
	for id, j := range a.jobs {
		p, ok := j.h.(executor.Picked)
		if j.a.Choose == 0 || !ok {
			continue
		}
		var ids []string
		for _, i := range p.Picked() {
			if i >= 0 && i < len(j.a.Devices) {
				ids = append(ids, j.a.Devices[i].ID)
			}
		}
		if len(ids) == 0 {
			continue
		}
		if out == nil {
			out = map[string][]string{}
		}
		out[id] = ids
	}
	return out
}

// start runs an assignment unless it already runs or ran.
func (a *Agent) start(ctx context.Context, as api.Assignment) {
	a.mu.Lock()
	if _, ok := a.jobs[as.JobID]; ok || a.done[as.JobID] {
		a.mu.Unlock()
		return
	}
	j := &job{a: as, logsEnd: make(chan struct{})}
	a.jobs[as.JobID] = j
	a.mu.Unlock()
	if as.Spec.Model != nil {
		// A pull may take minutes: the heartbeats go on meanwhile.
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.pullThenLaunch(ctx, j)
		}()
		return
	}
	a.launch(ctx, j)
}

// pullThenLaunch pulls the job's model into the node's cache, telling the
// job's log how far it is, then starts the job with {model} and
// {model_file} filled.
func (a *Agent) pullThenLaunch(ctx context.Context, j *job) {
	as := j.a
	m := as.Spec.Model
	fail := func(err error) {
		close(j.logsEnd)
		a.postLog(ctx, as.JobID, []byte("kiln: the job failed to start: "+err.Error()+"\n"))
		a.finish(ctx, as.JobID, api.ExitReport{Code: -1, Reason: "failed to start"})
	}
	if a.cfg.Models == nil {
		fail(fmt.Errorf("the job needs the model %s, and this node has no model cache (kiln agent --model-cache)", m.Ref))
		return
	}
	a.postLog(ctx, as.JobID, []byte(fmt.Sprintf("kiln: pulling the model %s into the node's cache\n", m.Ref)))
	var last time.Time
	progress := func(done, total int64) {
		if time.Since(last) < 2*time.Second && done < total {
			return
		}
		last = time.Now()
		a.postLog(ctx, as.JobID, []byte(fmt.Sprintf("kiln: model %s: %d of %d MiB\n", m.Ref, done>>20, total>>20)))
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		// A stop order during the pull ends it.
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-t.C:
				a.mu.Lock()
				stopped := j.stopped != ""
				a.mu.Unlock()
				if stopped {
					cancel()
					return
				}
			}
		}
	}()
	dir, file, err := a.cfg.Models.PullPinned(pctx, m.Ref, m.Digest, progress)
	if err == nil {
		a.mu.Lock()
		j.model = m.Digest // released when the job ends
		a.mu.Unlock()
	}
	a.mu.Lock()
	stopped := j.stopped
	a.mu.Unlock()
	if stopped != "" {
		close(j.logsEnd)
		a.finish(ctx, as.JobID, api.ExitReport{Code: -1, Reason: stopped})
		return
	}
	if err != nil {
		fail(fmt.Errorf("pulling the model %s: %w", m.Ref, err))
		return
	}
	if file == "" {
		file = dir
	}
	seenDir, seenFile := dir, file
	if as.Spec.Image != "" {
		// A container sees the model read-only at executor.ModelTarget.
		rel, err := filepath.Rel(dir, file)
		if err != nil || strings.HasPrefix(rel, "..") {
			fail(fmt.Errorf("the model's weights file %s is not inside its folder %s", file, dir))
			return
		}
		seenDir, seenFile = executor.ModelTarget, path.Join(executor.ModelTarget, filepath.ToSlash(rel))
	}
	fill := strings.NewReplacer("{model}", seenDir, "{model_file}", seenFile)
	spec := as.Spec
	spec.Command = slices.Clone(spec.Command)
	for i, w := range spec.Command {
		spec.Command[i] = fill.Replace(w)
	}
	spec.Env = maps.Clone(spec.Env)
	for k, v := range spec.Env {
		spec.Env[k] = fill.Replace(v)
	}
	a.mu.Lock()
	j.a.Spec = spec
	j.modelDir = dir
	a.mu.Unlock()
	a.launch(ctx, j)
}

// launch starts a job with its executor.
func (a *Agent) launch(ctx context.Context, j *job) {
	as := j.a
	ej := executor.Job{ID: as.JobID, LeaseID: as.LeaseID, Command: as.Spec.Command, Image: as.Spec.Image, WorkDir: as.Spec.WorkDir, Env: map[string]string{}}
	for k, v := range as.Spec.Env {
		ej.Env[k] = v
	}
	ej.Env["KILN_RANK"] = fmt.Sprint(as.Rank)
	ej.Env["KILN_WORLD_SIZE"] = fmt.Sprint(as.Size)
	ej.Env["KILN_PROJECT"] = as.Project
	ej.Env["KILN_JOB_ID"] = as.JobID
	ej.Env["KILN_LEASE_ID"] = as.LeaseID
	if as.User != "" {
		ej.Env["KILN_USER"] = as.User
	}
	ej.Limits = executor.Limits{CPUMilli: as.Resources.CPUMilli, MemoryBytes: as.Resources.MemoryBytes}
	a.mu.Lock()
	ej.ModelDir = j.modelDir
	a.mu.Unlock()
	if ej.WorkDir == "" {
		ej.WorkDir = a.cfg.WorkDir
	}
	for _, d := range as.Devices {
		ed := executor.Device{Vendor: d.Vendor, Index: d.Index, PCIAddress: d.PCIAddress, UUID: d.UUID, CDIName: cdiName(d)}
		if d.Isolation != api.IsolationExclusive {
			ed.Share = &executor.Share{MilliGPU: d.MilliGPU, MemoryBytes: d.MemoryBytes, Isolation: d.Isolation}
		}
		ej.Devices = append(ej.Devices, ed)
	}
	exe := a.cfg.Executor
	var note string
	if as.Spec.Image != "" {
		exe = a.cfg.Containers
		if a.cfg.Recorded {
			// Recorded GPUs have no device nodes to inject: the job gets
			// the environment that names them, as a process would.
			for k, v := range process.Env(ej.Devices) {
				ej.Env[k] = v
			}
			ej.Devices = nil
			note = "kiln: this node's GPUs are recorded, not real: the container gets their environment, no device\n"
		}
	}
	var h executor.Handle
	err := fmt.Errorf("this node cannot run containers: %s", a.cfg.NoContainers)
	if as.Spec.Image == "" {
		// Never with less than the lease requires, whatever the server
		// thinks this node gives.
		var lack []string
		for _, q := range as.Require {
			if !a.sandbox.Has(q) {
				lack = append(lack, q)
			}
		}
		if len(lack) > 0 {
			exe, err = nil, fmt.Errorf("the lease requires %s, which this node's jobs do not get", strings.Join(lack, ", "))
		}
	}
	if as.Choose > 0 {
		ej.Choose = as.Choose
		if c, ok := exe.(executor.Chooser); exe != nil && (!ok || !c.LetsSchedulerChoose()) {
			exe, err = nil, fmt.Errorf("the lease leaves the choice of %d of its %d GPUs to the cluster's scheduler, and this node's %s executor has none", as.Choose, len(as.Devices), exe.Name())
		}
	}
	if exe != nil {
		// The job outlives a server outage but not the agent.
		sctx := context.WithoutCancel(ctx)
		if pe, ok := exe.(interface {
			StartWith(context.Context, executor.Job, process.JobOptions) (executor.Handle, error)
		}); ok {
			h, err = pe.StartWith(sctx, ej, process.JobOptions{User: as.User, Require: as.Require})
		} else {
			h, err = exe.Start(sctx, ej)
		}
	}
	if err != nil {
		close(j.logsEnd)
		a.postLog(ctx, as.JobID, []byte("kiln: the job failed to start: "+err.Error()+"\n"))
		a.finish(ctx, as.JobID, api.ExitReport{Code: -1, Reason: "failed to start"})
		return
	}
	if note != "" {
		a.postLog(ctx, as.JobID, []byte(note))
	}
	a.mu.Lock()
	j.h = h
	stopReason := j.stopped
	a.mu.Unlock()
	a.wg.Add(2)
	go a.pumpLogs(ctx, j)
	go a.await(ctx, j)
	if stopReason != "" {
		go h.Stop(context.Background(), 0)
	}
}

// cdiName is the CDI device of a granted unit: kiln.dev/gpu=<index> for a
// GPU or a share of one, kiln.dev/gpu=<index>:<gi>:<ci> for a MIG instance
// (unit "gpu0/mig3.0").
func cdiName(d api.DeviceGrant) string {
	if _, mig, ok := strings.Cut(d.ID, "/mig"); ok {
		var gi, ci int
		if _, err := fmt.Sscanf(mig, "%d.%d", &gi, &ci); err == nil {
			return cdi.QualifiedName(cdi.MIGName(d.Index, gi, ci))
		}
	}
	return cdi.QualifiedName(cdi.GPUName(d.Index))
}

// pumpLogs sends the job's output to the server in chunks.
func (a *Agent) pumpLogs(ctx context.Context, j *job) {
	defer a.wg.Done()
	defer close(j.logsEnd)
	r := j.h.Logs()
	defer r.Close()
	chunks := make(chan []byte, 64)
	go func() {
		defer close(chunks)
		buf := make([]byte, 64<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				chunks <- append([]byte(nil), buf[:n]...)
			}
			if err != nil {
				return
			}
		}
	}()
	var pending bytes.Buffer
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case c, ok := <-chunks:
			if !ok {
				a.postLog(ctx, j.a.JobID, pending.Bytes())
				return
			}
			pending.Write(c)
			if pending.Len() >= 256<<10 {
				a.postLog(ctx, j.a.JobID, pending.Bytes())
				pending.Reset()
			}
		case <-tick.C:
			if pending.Len() > 0 {
				a.postLog(ctx, j.a.JobID, pending.Bytes())
				pending.Reset()
			}
		}
	}
}

func (a *Agent) postLog(ctx context.Context, id string, b []byte) {
	a.mu.Lock()
	cut := a.logsCut[id]
	a.mu.Unlock()
	if len(b) == 0 || cut {
		return
	}
	for try := 0; try < 5; try++ {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := a.client.JobLogChunk(rctx, a.node, id, b)
		cancel()
		if err == nil {
			return
		}
		if s := api.StatusOf(err); s >= 400 && s < 500 {
			if s == 403 {
				// Over a log limit: the server keeps no more of it.
				a.mu.Lock()
				a.logsCut[id] = true
				a.mu.Unlock()
			}
			return
		}
		time.Sleep(time.Duration(200*(try+1)) * time.Millisecond)
	}
}

func (a *Agent) await(ctx context.Context, j *job) {
	defer a.wg.Done()
	ex, err := j.h.Wait(context.WithoutCancel(ctx))
	<-j.logsEnd
	rep := api.ExitReport{Code: ex.Code, Signal: ex.Signal, Reason: ex.Reason}
	if err != nil {
		rep = api.ExitReport{Code: -1, Reason: err.Error()}
	}
	a.mu.Lock()
	if j.stopped != "" {
		rep.Reason = j.stopped
	}
	a.mu.Unlock()
	rep.GPU = a.takeUse(j.a.JobID)
	a.finish(ctx, j.a.JobID, rep)
}

// finish reports a job's end until the server acknowledges it; until then
// the job stays in the running list, so the server never takes it for lost.
func (a *Agent) finish(ctx context.Context, id string, rep api.ExitReport) {
	a.mu.Lock()
	if j := a.jobs[id]; j != nil && j.model != "" {
		// Its model may be evicted now.
		a.cfg.Models.Release(j.model)
		j.model = ""
	}
	a.mu.Unlock()
	backoff := 100 * time.Millisecond
	for {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		if a.olderServer("gpu") {
			rep.GPU = nil
		}
		_, err := a.client.JobExit(rctx, a.node, id, rep)
		if err != nil && rep.GPU != nil && a.refusesField(err, "gpu") {
			// An older server: the job's end matters, its GPU use does not.
			rep.GPU = nil
			_, err = a.client.JobExit(rctx, a.node, id, rep)
		}
		cancel()
		if err == nil || (api.StatusOf(err) >= 400 && api.StatusOf(err) < 500) {
			break
		}
		if ctx.Err() != nil {
			return
		}
		time.Sleep(backoff)
		backoff = min(backoff*2, 2*time.Second)
	}
	a.mu.Lock()
	delete(a.jobs, id)
	delete(a.logsCut, id)
	a.done[id] = true
	a.doneList = append(a.doneList, id)
	if len(a.doneList) > 100000 {
		delete(a.done, a.doneList[0])
		a.doneList = a.doneList[1:]
	}
	a.mu.Unlock()
}

// stop carries out a stop order: the notice goes to the job's log, then
// SIGTERM, then SIGKILL after the grace period.
func (a *Agent) stop(o api.StopOrder) {
	a.mu.Lock()
	j := a.jobs[o.JobID]
	if j == nil || j.stopped != "" {
		a.mu.Unlock()
		return
	}
	j.stopped = o.Reason
	if j.stopped == "" {
		j.stopped = "stopped by the server"
	}
	h := j.h
	a.mu.Unlock()
	if h == nil {
		return
	}
	if o.Notice != "" {
		go a.postLog(context.Background(), o.JobID, []byte("\n"+o.Notice+"\n"))
	}
	go h.Stop(context.Background(), time.Duration(o.GraceMS)*time.Millisecond)
}

// stopAll stops every job when the agent ends.
func (a *Agent) stopAll() {
	a.mu.Lock()
	var hs []executor.Handle
	for _, j := range a.jobs {
		if j.h != nil {
			hs = append(hs, j.h)
		}
	}
	a.mu.Unlock()
	for _, h := range hs {
		_ = h.Stop(context.Background(), 2*time.Second)
	}
	done := make(chan struct{})
	go func() { a.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
}
