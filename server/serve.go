package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/compat"
	"kiln.dev/kiln/plan"
	"kiln.dev/kiln/serving"
	"kiln.dev/kiln/store"
	"kiln.dev/kiln/textsafe"
)

// Model deployments (kiln serve): the choice of engine, image, node and
// GPUs made on the server's nodes, and what the server knows of each
// serving lease now (its engine's readiness, what its endpoint routed).

// Readiness checks of deployments.
const (
	deployProbeEvery   = time.Second
	deployProbeTimeout = 2 * time.Second
	// deployUnreadyAfter failed checks in a row take a ready deployment
	// out of the endpoint's routing.
	deployUnreadyAfter = 3
)

// deployments holds each live serving lease's state, by lease id.
type deployments struct {
	mu sync.Mutex
	m  map[string]*deployState
	rr uint64 // round robin over replicas
	// pending is the usage not yet kept, by project, model and day.
	pending map[usageKey]api.ServeUsage
}

type usageKey struct{ project, model, day string }

// deployUsageFlush is how often the endpoint's usage is written to the
// store (and when the server stops).
const deployUsageFlush = 5 * time.Second

// takeUsage hands over the usage not yet kept.
func (d *deployments) takeUsage() map[usageKey]api.ServeUsage {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.pending
	d.pending = nil
	return p
}

// keepUsage writes the usage not yet kept; what cannot be written is kept
// for the next time.
func (s *Server) keepUsage(ctx context.Context) {
	p := s.deploys.takeUsage()
	if len(p) == 0 {
		return
	}
	err := s.st.Update(ctx, func(tx *store.Tx) error {
		for k, u := range p {
			if err := tx.AddServeUsage(k.project, k.model, k.day, u); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		s.log.Warn("keeping the endpoint's usage", "err", err)
		s.deploys.mu.Lock()
		if s.deploys.pending == nil {
			s.deploys.pending = map[usageKey]api.ServeUsage{}
		}
		for k, u := range p {
			s.deploys.pending[k] = addUsage(s.deploys.pending[k], u)
		}
		s.deploys.mu.Unlock()
	}
}

func addUsage(a, b api.ServeUsage) api.ServeUsage {
	return api.ServeUsage{Requests: a.Requests + b.Requests, Errors: a.Errors + b.Errors,
		PromptTokens: a.PromptTokens + b.PromptTokens, CompletionTokens: a.CompletionTokens + b.CompletionTokens}
}

type deployState struct {
	api.Deployment
	fails int
}

// status is a copy of a lease's deployment state, nil when it is not one
// the server has seen.
func (d *deployments) status(id string) *api.Deployment {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.m[id]
	if st == nil {
		return nil
	}
	c := st.Deployment
	return &c
}

func (d *deployments) ready(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.m[id]
	return st != nil && st.State == api.DeployReady
}

// next picks one of n replicas.
func (d *deployments) next(n int) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rr++
	return int(d.rr % uint64(n))
}

// count adds one routed request's outcome, to its deployment and to its
// project's usage of the day.
func (d *deployments) count(t serveTarget, failed bool, prompt, completion int64, now time.Time) {
	u := api.ServeUsage{Requests: 1, PromptTokens: prompt, CompletionTokens: completion}
	if failed {
		u.Errors = 1
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pending == nil {
		d.pending = map[usageKey]api.ServeUsage{}
	}
	k := usageKey{t.project, t.model, now.UTC().Format(time.DateOnly)}
	d.pending[k] = addUsage(d.pending[k], u)
	if st := d.m[t.lease]; st != nil {
		st.Usage = addUsage(st.Usage, u)
	}
}

// probed records a readiness check; it says whether the state changed.
func (d *deployments) probed(id string, ok bool, reason string, now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.m[id]
	if st == nil {
		return false
	}
	was := st.State
	switch {
	case ok:
		st.fails, st.Reason = 0, ""
		st.State = api.DeployReady
	case st.State == api.DeployStarting:
		st.Reason = reason
	default:
		st.fails++
		st.Reason = reason
		if st.fails >= deployUnreadyAfter {
			st.State = api.DeployUnready
		}
	}
	if st.State != was {
		st.Since = now.UTC()
		return true
	}
	return false
}

// sync keeps the states of the live serving leases, adds new ones as
// starting and drops those that ended. A lease whose engine is not running
// (restarting, its port not open yet) is starting again.
func (d *deployments) sync(live map[string]bool, now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = map[string]*deployState{}
	}
	changed := false
	for id := range d.m {
		if _, ok := live[id]; !ok {
			delete(d.m, id)
		}
	}
	for id, running := range live {
		st := d.m[id]
		if st == nil {
			d.m[id] = &deployState{Deployment: api.Deployment{State: api.DeployStarting, Since: now.UTC()}}
			changed = true
			continue
		}
		if !running && st.State != api.DeployStarting {
			st.State, st.Since, st.fails = api.DeployStarting, now.UTC(), 0
			changed = true
		}
	}
	return changed
}

// serveTarget is where a serving lease's engine listens now.
type serveTarget struct {
	lease, project, user, model string
	job, node                   string
	port                        int
	ready                       string
}

// serveTargets are the serving leases the core holds, each with its
// engine's job and node when its port is open; s.mu is held.
func (s *Server) serveTargets(keep func(*api.Lease) bool) (live map[string]bool, open []serveTarget) {
	live = map[string]bool{}
	for _, l := range s.core.Leases(time.Now(), func(l *api.Lease) bool {
		return l.Request.Serve != nil && l.State == api.LeaseGranted && (keep == nil || keep(l))
	}) {
		sv := l.Request.Serve
		t := serveTarget{lease: l.ID, project: l.Project, user: l.User, model: sv.Model, port: sv.Port, ready: sv.Ready}
		for i := len(l.Jobs) - 1; i >= 0 && t.job == ""; i-- {
			j := s.core.Job(l.Jobs[i])
			if j == nil || j.State != api.JobRunning || !slices.Contains(j.Spec.Ports, sv.Port) {
				continue
			}
			for _, tk := range j.Tasks {
				if tk.Rank == 0 && tk.State == api.JobRunning && slices.Contains(tk.OpenPorts, sv.Port) {
					t.job, t.node = j.ID, tk.Node
				}
			}
		}
		live[l.ID] = t.job != ""
		if t.job != "" {
			open = append(open, t)
		}
	}
	return live, open
}

// prober checks the readiness of every serving lease whose engine's port
// is open, every deployProbeEvery, until the server stops.
func (s *Server) prober(ctx context.Context) {
	defer s.loopWG.Done()
	t := time.NewTicker(deployProbeEvery)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			s.keepUsage(context.Background()) // the store closes after this loop
			return
		case <-t.C:
		}
		s.probeDeployments(ctx)
		if time.Since(last) >= deployUsageFlush {
			s.keepUsage(ctx)
			last = time.Now()
		}
	}
}

func (s *Server) probeDeployments(ctx context.Context) {
	s.mu.Lock()
	live, open := s.serveTargets(nil)
	s.mu.Unlock()
	changed := s.deploys.sync(live, time.Now())
	var wg sync.WaitGroup
	var cmu sync.Mutex
	for _, t := range open {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, reason := s.probe(ctx, t)
			if s.deploys.probed(t.lease, ok, reason, time.Now()) {
				s.log.Info("deployment", "lease", t.lease, "model", t.model, "ready", ok, "reason", reason)
				cmu.Lock()
				changed = true
				cmu.Unlock()
			}
		}()
	}
	wg.Wait()
	if changed {
		s.mu.Lock()
		s.notify()
		s.mu.Unlock()
	}
}

// probe asks the engine's readiness path, through the tunnel, for a 200.
func (s *Server) probe(ctx context.Context, t serveTarget) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, deployProbeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://engine"+t.ready, nil)
	if err != nil {
		return false, err.Error()
	}
	tr := s.proxies.transport(s, proxyKey{user: "\x00probe", node: t.node, job: t.job, port: t.port})
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return false, fmt.Sprintf("%s: %v", t.ready, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Sprintf("%s answered %s", t.ready, resp.Status)
	}
	return true, ""
}

// withDeployment is a copy of l with its deployment's state, for answers.
func (s *Server) withDeployment(l api.Lease) api.Lease {
	if l.Request.Serve != nil && !api.LeaseFinal(l.State) {
		l.Deployment = s.deploys.status(l.ID)
		if l.Deployment == nil {
			l.Deployment = &api.Deployment{State: api.DeployStarting}
		}
	}
	return l
}

// catalogue is kiln's engine catalogue, read once.
var catalogue = sync.OnceValues(serving.Default)

// serveChoose answers how the server's nodes would serve a model.
func (s *Server) serveChoose(w http.ResponseWriter, r *http.Request) {
	req, ok := readRequest(w, r, maxBody, parseServeChoose)
	if !ok {
		return
	}
	cat, err := catalogue()
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	m, sreq, err := servingInput(req)
	if err != nil {
		writeErr(w, http.StatusBadRequest, err)
		return
	}
	read := s.readImages(r.Context())
	s.mu.Lock()
	var nodes []serving.Node
	snaps := s.core.Snapshots()
	for _, n := range s.core.Nodes() {
		if n.State == api.NodeReady && snaps[n.ID] != nil {
			nodes = append(nodes, serving.Node{Name: n.ID, Snapshot: snaps[n.ID]})
		}
	}
	s.mu.Unlock()
	out, err := serving.Choose(m, sreq, nodes, cat, s.cfg.KB, read)
	if err != nil {
		writeErr(w, http.StatusUnprocessableEntity, err)
		return
	}
	engines := map[string]serving.Engine{}
	for _, e := range cat.Engines {
		engines[e.Name] = e
	}
	if sreq.Custom != nil {
		engines[sreq.Custom.Name] = *sreq.Custom
	}
	reply := api.ServeChooseReply{Skipped: out.Skipped}
	for i, c := range append([]serving.Choice{out.Best}, out.Others...) {
		e := engines[c.Engine]
		if req.Port != 0 {
			e.Port = req.Port // a replica's, or the user's
		}
		ac, err := apiChoice(c, e, m)
		if err != nil {
			writeErr(w, http.StatusBadRequest, err)
			return
		}
		if i == 0 {
			reply.Best = ac
		} else {
			reply.Others = append(reply.Others, ac)
		}
	}
	writeJSON(w, http.StatusOK, reply)
}

// readImages is what kiln compat read of images, from the server's
// catalogue of them (nil when it has none or it fails: the engine
// catalogue's lines decide then).
func (s *Server) readImages(ctx context.Context) serving.ImageReader {
	if s.cfg.CheckedImages == nil {
		return nil
	}
	imgs, err := s.cfg.CheckedImages.CheckedImages(ctx)
	if err != nil {
		s.log.Warn("compat cache", "err", err)
		return nil
	}
	by := map[string]*compat.Requirements{}
	for _, c := range imgs {
		if _, ok := by[c.Ref]; !ok && c.Requirements != nil && (c.Platform == "" || strings.HasSuffix(c.Platform, "/amd64")) {
			by[c.Ref] = c.Requirements
		}
	}
	return func(ref string) *compat.Requirements { return by[ref] }
}

func apiChoice(c serving.Choice, e serving.Engine, m serving.Model) (api.ServeChoice, error) {
	modelArg, file := m.Path, m.File
	if file == "" {
		file = m.Path
	}
	if m.Path == "" {
		// A model of the registry: the node fills in where its cache
		// holds it.
		modelArg, file = "{model}", "{model_file}"
	}
	args, err := e.Args(serving.Values{Model: modelArg, ModelFile: file, Name: m.Name, Port: e.Port, TP: c.GPUs, Context: c.Context})
	if err != nil {
		return api.ServeChoice{}, err
	}
	return api.ServeChoice{Engine: c.Engine, Image: c.Image, Node: c.Node, GPUs: c.GPUs, Island: c.Island, Link: c.Link,
		Verdict: string(c.Verdict), VerdictFrom: c.VerdictFrom, MemoryPerGPUBytes: c.MemoryPerGPUBytes,
		CapacityBytes: c.CapacityBytes, Context: c.Context, Batch: c.Batch, Command: args, Port: e.Port,
		Ready: e.Ready, Notes: c.Notes}, nil
}

// servingInput turns the request into serving's terms.
func servingInput(req api.ServeChooseRequest) (serving.Model, serving.Request, error) {
	m := serving.Model{Name: req.Model.Name, Format: req.Model.Format, Precision: req.Model.Precision,
		WeightsBytes: req.Model.WeightsBytes, Path: req.Model.Path, File: req.Model.File}
	if req.Model.Ref != "" {
		m.Path, m.File = "", ""
	}
	if sh := req.Model.Shape; sh != nil {
		m.Arch = &plan.Model{Name: req.Model.Name, Layers: sh.Layers, EncoderLayers: sh.EncoderLayers, Hidden: sh.Hidden,
			Heads: sh.Heads, KVHeads: sh.KVHeads, HeadDim: sh.HeadDim, FFN: sh.FFN, Gated: sh.Gated, Tied: sh.Tied,
			Vocab: sh.Vocab, Seq: sh.Seq, MaxSeq: sh.MaxSeq, Experts: sh.Experts, ExpertsPerToken: sh.ExpertsPerToken,
			PublishedParams: sh.Params, Source: "the model's config, as kiln serve read it"}
		if err := m.Arch.Validate(); err != nil {
			return m, serving.Request{}, fmt.Errorf("model.shape: %w", err)
		}
	}
	sr := serving.Request{Engine: req.Engine, Context: req.Context, Batch: req.Batch, GPUs: req.GPUs, Process: req.Process}
	if req.Image != "" || len(req.Command) > 0 {
		if req.Engine != "" {
			return m, sr, fmt.Errorf("give an engine of kiln's catalogue (%s) or an image or command of your own, not both", req.Engine)
		}
		e, err := serving.CustomEngine(req.Model.Format, req.Image, req.Command, req.Port, req.Ready)
		if err != nil {
			return m, sr, err
		}
		sr.Custom = e
	}
	return m, sr, nil
}

// sortedModels lists the served names in order.
func sortedModels(ts []serveTarget) []serveTarget {
	sort.Slice(ts, func(i, j int) bool {
		if ts[i].model != ts[j].model {
			return ts[i].model < ts[j].model
		}
		return ts[i].lease < ts[j].lease
	})
	return ts
}

// Bounds of a stored serve test.
const (
	maxSmokeChecks = 16
	maxLoadLevels  = 64
	maxTestText    = 1024
	// maxServeTests is the most tests one deployment keeps.
	maxServeTests = 200
)

func parseServeTest(b []byte) (api.ServeTest, error) {
	var t api.ServeTest
	if err := decodeJSON(b, &t); err != nil {
		return t, err
	}
	if len(t.Smoke) > maxSmokeChecks || len(t.Load) > maxLoadLevels {
		return t, fmt.Errorf("at most %d smoke checks and %d load levels", maxSmokeChecks, maxLoadLevels)
	}
	for _, s := range t.Smoke {
		if s.Name == "" || len(s.Name) > 64 || !printableLine(s.Name) || len(s.Detail) > maxTestText || !printableLine(s.Detail) {
			return t, errors.New("smoke: a check needs a name (at most 64 printable characters) and a detail of at most 1024")
		}
	}
	for _, l := range t.Load {
		nums := []float64{l.Seconds, l.RequestsPerSecond, l.OutputTokensPerSecond, l.TTFTP50MS, l.TTFTP99MS, l.ITLP50MS, l.ITLP99MS, l.LatencyP50MS, l.LatencyP99MS}
		for _, v := range nums {
			if !finite(v) || v < 0 || v > 1e12 {
				return t, errors.New("load: times and rates must be finite, 0 or more")
			}
		}
		if l.Concurrency < 1 || l.Concurrency > 100000 || l.Requests < 0 || l.Requests > 1e8 || l.Errors < 0 || l.Errors > l.Requests {
			return t, fmt.Errorf("load: concurrency %d, requests %d, errors %d", l.Concurrency, l.Requests, l.Errors)
		}
		if len(l.FirstError) > maxTestText || !printableLine(l.FirstError) {
			return t, errors.New("load: first_error is at most 1024 printable characters")
		}
	}
	return t, nil
}

// addServeTest keeps kiln serve test's results with the deployment; where
// it ran comes from the lease, not from the caller.
func (s *Server) addServeTest(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	in, ok := readRequest(w, r, maxBody, parseServeTest)
	if !ok {
		return
	}
	s.mu.Lock()
	l, _, err := s.leaseByID(r, r.PathValue("id"))
	var lc api.Lease
	if err == nil {
		lc = *l
	}
	s.mu.Unlock()
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	if lc.Request.Serve == nil {
		writeErr(w, http.StatusConflict, fmt.Errorf("lease %s is not a model deployment (kiln serve)", lc.ID))
		return
	}
	t := api.ServeTest{ID: newID("st-"), LeaseID: lc.ID, Project: lc.Project, User: c.user.Name, Model: lc.Request.Serve.Model,
		Engine: lc.Request.Serve.Engine, At: time.Now().UTC(), Smoke: in.Smoke, Load: in.Load}
	if t.Smoke == nil {
		t.Smoke = []api.ServeSmoke{}
	}
	if t.Load == nil {
		t.Load = []api.ServeLoad{}
	}
	if lc.Request.Job != nil {
		t.Image = lc.Request.Job.Image
	}
	for _, a := range lc.Allocations {
		t.Node, t.GPUs = a.Node, len(a.Devices)
		if len(a.Devices) > 0 {
			t.GPUModel = a.Devices[0].Model
		}
	}
	err = s.st.Update(r.Context(), func(tx *store.Tx) error {
		n, err := tx.ServeTestCount(lc.ID)
		if err != nil {
			return err
		}
		if n >= maxServeTests {
			return errStatus(http.StatusConflict, "deployment %s keeps %d tests already, the most it may", lc.ID, maxServeTests)
		}
		return tx.PutServeTest(t)
	})
	if err != nil {
		writeErr(w, http.StatusServiceUnavailable, fmt.Errorf("storing the test: %w", err))
		return
	}
	writeJSON(w, http.StatusCreated, t)
}

// listServeTests lists the stored tests of the caller's projects.
func (s *Server) listServeTests(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	model := r.URL.Query().Get("model")
	if model != "" && serving.CheckName(model) != nil {
		writeErr(w, http.StatusBadRequest, fmt.Errorf("model %q: not a deployment name", textsafe.Printable(trunc(model))))
		return
	}
	var projects []string
	if !c.admin() {
		projects = append([]string{"\x00none"}, c.user.Projects...)
	}
	var out []api.ServeTest
	err := s.st.View(r.Context(), func(tx *store.Tx) error {
		var err error
		out, err = tx.ServeTests(projects, model, 200)
		return err
	})
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, api.ServeTestList{Tests: out})
}

// serveUsage lists the endpoint's kept usage for the caller's projects.
func (s *Server) serveUsage(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	days, err := queryFloat(r, "days", 1, 3660, 30)
	if err != nil {
		writeErr(w, 0, err)
		return
	}
	s.keepUsage(r.Context()) // what was routed until now
	since := time.Now().UTC().AddDate(0, 0, -int(days)+1).Format(time.DateOnly)
	var projects []string
	if !c.admin() {
		projects = append([]string{"\x00none"}, c.user.Projects...)
	}
	var out []api.ServeUsageRow
	err = s.st.View(r.Context(), func(tx *store.Tx) error {
		var err error
		out, err = tx.ServeUsage(projects, since)
		return err
	})
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, api.ServeUsageList{Usage: out})
}
