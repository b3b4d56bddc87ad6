package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"kiln.dev/kiln/placement"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/store"
)

func (s *Server) createLease(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	req, ok := readRequest(w, r, maxBody, parseLeaseRequest)
	if !ok {
		return
	}
	var allowed []string
	if req.Job != nil && req.Job.Image != "" && s.cfg.Images != nil {
		var err error
		allowed, err = s.imageNodes(r, req.Job.Image)
		if err != nil {
			writeErr(w, http.StatusBadGateway, err)
			return
		}
	}
	s.answer(w, http.StatusCreated, func() (any, uint64, error) {
		if err := s.down(); err != nil {
			return nil, 0, withStatus(http.StatusServiceUnavailable, err)
		}
		if req.Project == "" {
			ps := append([]string(nil), c.user.Projects...)
			if len(ps) != 1 {
				return nil, 0, errStatus(http.StatusBadRequest, "give a project: you are in %s", listOr(ps, "no project"))
			}
			req.Project = ps[0]
		}
		if _, ok := s.projects[req.Project]; !ok {
			return nil, 0, errStatus(http.StatusNotFound, "project %s does not exist", req.Project)
		}
		if max := s.cfg.MaxTimeLimit; time.Duration(req.TimeLimitSeconds)*time.Second > max {
			return nil, 0, errStatus(http.StatusBadRequest, "time_limit_s %d: this server allows at most %s (%d s)", req.TimeLimitSeconds, max, int64(max/time.Second))
		}
		if !c.canSee(req.Project) {
			return nil, 0, errStatus(http.StatusForbidden, "you are not a member of project %s", req.Project)
		}
		if err := s.queueRoom(req.Project, c.user.Name); err != nil {
			return nil, 0, err
		}
		if req.Job != nil {
			if err := s.jobRoom(req.Project, req.Job, 0); err != nil {
				return nil, 0, err
			}
		}
		now := time.Now()
		l := &api.Lease{ID: newID("l-"), Project: req.Project, User: c.user.Name, State: api.LeaseQueued, Request: req, CreatedAt: now.UTC()}
		ls := s.newLeaseState(l)
		l.GPUs = ls.need
		noContainers := ""
		if req.Job != nil && req.Job.Image != "" {
			// An image runs only where the agent has a container executor.
			var nodes []string
			nodes, noContainers = s.containerNodes()
			if allowed == nil {
				allowed = nodes
			} else {
				allowed = intersect(allowed, nodes)
			}
		}
		sandboxRefusal := ""
		if len(req.Require) > 0 {
			nodes, why := s.sandboxNodes(req.Require)
			if len(s.nodes) == 0 {
				why = "no node has joined yet"
			}
			if len(nodes) == 0 {
				// An empty list of nodes would mean any node.
				sandboxRefusal = fmt.Sprintf("no node gives its jobs %s, and kiln never runs them with less: %s", strings.Join(req.Require, ", "), why)
			}
			if allowed == nil {
				allowed = nodes
			} else {
				allowed = intersect(allowed, nodes)
			}
		}
		if allowed != nil {
			ls.req.Constraints.Nodes = intersect(ls.req.Constraints.Nodes, allowed)
			if len(req.Require) > 0 && len(ls.req.Constraints.Nodes) == 0 && sandboxRefusal == "" {
				sandboxRefusal = fmt.Sprintf("none of the nodes asked for gives its jobs %s", strings.Join(req.Require, ", "))
			}
		}
		b := newBatch()
		if req.Job != nil {
			j := &api.Job{ID: newID("j-"), LeaseID: l.ID, Project: l.Project, State: api.JobPending, Spec: *req.Job, Created: now.UTC()}
			js := &jobState{j: j, lease: ls}
			ls.jobs = append(ls.jobs, js)
			l.Jobs = append(l.Jobs, j.ID)
			s.jobs[j.ID] = js
			b.job(j)
		}
		s.leases[l.ID] = ls
		b.lease(l)
		b.event("lease.created", l.ID, l.Project, "%s asks for %s", l.User, sizeText(req))
		if sandboxRefusal != "" {
			s.finishLease(ls, api.LeaseRefused, sandboxRefusal, now, b)
		} else if reason := s.refusal(ls, allowed, noContainers); reason != "" {
			s.finishLease(ls, api.LeaseRefused, reason, now, b)
		} else {
			ls.checkFit = true
			s.schedule(now, b)
			if ls.l.State == api.LeaseQueued {
				s.refuseIfNeverFits(ls, now, b)
			}
		}
		seq, err := s.flush(b)
		if err != nil {
			return nil, 0, withStatus(http.StatusServiceUnavailable, err)
		}
		s.decorate(l, now)
		return l, seq, nil
	})
}

func intersect(a, b []string) []string {
	if len(a) == 0 {
		return append([]string{}, b...)
	}
	out := []string{}
	for _, x := range a {
		if slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

func listOr(xs []string, none string) string {
	if len(xs) == 0 {
		return none
	}
	return strings.Join(xs, ", ")
}

func sizeText(r api.LeaseRequest) string {
	switch {
	case r.GPUs == 1:
		return "1 GPU"
	case r.GPUs > 1:
		return fmt.Sprintf("%d GPUs", r.GPUs)
	case r.Fraction > 0:
		return fmt.Sprintf("%g of a GPU", r.Fraction)
	}
	return "MIG instance " + r.MIG
}

// sandboxNodes are the nodes whose sandbox gives everything required, and
// why the others do not (the first few).
func (s *Server) sandboxNodes(require []string) ([]string, string) {
	out := []string{}
	var why []string
	for _, n := range s.nodeList() {
		sb := n.rec.Node.Sandbox
		var lack []string
		for _, q := range require {
			if !sb.Has(q) {
				lack = append(lack, q)
			}
		}
		if len(lack) == 0 {
			out = append(out, n.rec.Node.ID)
		} else if len(why) < 5 {
			detail := "it reports no sandbox"
			if sb != nil {
				detail = strings.Join(sb.Missing, "; ")
			}
			why = append(why, fmt.Sprintf("%s lacks %s (%s)", n.rec.Node.ID, strings.Join(lack, ", "), detail))
		}
	}
	return out, strings.Join(why, "; ")
}

// containerNodes are the nodes that run jobs with an image, and why the
// others do not.
func (s *Server) containerNodes() ([]string, string) {
	out := []string{}
	var why []string
	for _, n := range s.nodeList() {
		if n.rec.Node.Containers != "" {
			out = append(out, n.rec.Node.ID)
		} else if len(why) < 5 {
			r := n.rec.Node.NoContainers
			if r == "" {
				r = "its agent has not said it runs containers"
			}
			why = append(why, n.rec.Node.ID+": "+r)
		}
	}
	return out, strings.Join(why, "; ")
}

// refusal says why a lease cannot be granted as asked whatever the
// devices hold (quotas, images), or "".
// noContainers says why nodes cannot run the lease's image, if it has one.
func (s *Server) refusal(ls *leaseState, allowed []string, noContainers string) string {
	ps := s.project(ls.l.Project)
	if ps.p.MaxGPUs > 0 && ls.need > ps.p.MaxGPUs+1e-9 {
		return fmt.Sprintf("asks for %g GPUs; project %s may hold at most %g at once", ls.need, ps.p.Name, ps.p.MaxGPUs)
	}
	if ps.p.GPUHours > 0 {
		if used := s.usedHours(ps, time.Now()); used >= ps.p.GPUHours {
			return fmt.Sprintf("project %s used %.1f of its %g GPU-hours in this period", ps.p.Name, used, ps.p.GPUHours)
		}
	}
	if allowed != nil && len(ls.req.Constraints.Nodes) == 0 && ls.l.Request.Job != nil && ls.l.Request.Job.Image != "" {
		if len(allowed) == 0 && noContainers != "" {
			return fmt.Sprintf("image %s: no node can run containers (%s)", ls.l.Request.Job.Image, noContainers)
		}
		return fmt.Sprintf("image %s runs on no node it may use (kiln compat, container executors, the nodes asked for)", ls.l.Request.Job.Image)
	}
	return ""
}

// refuseIfNeverFits refuses a new lease that could not fit even if every
// device were free; it asks once per lease, the first time the lease
// cannot be placed at once, and says whether it refused.
func (s *Server) refuseIfNeverFits(ls *leaseState, now time.Time, b *batch) bool {
	if !ls.checkFit {
		return false
	}
	ls.checkFit = false
	if reason := s.neverFits(ls); reason != "" {
		s.finishLease(ls, api.LeaseRefused, reason, now, b)
		return true
	}
	return false
}

// neverFits says why the lease could not fit even on an idle cluster, or "".
func (s *Server) neverFits(ls *leaseState) string {
	if len(s.nodes) == 0 {
		return "" // nodes may still join: wait
	}
	// Could it fit if every device were free (drained ones included: they
	// come back)?
	if s.empty == nil || len(s.empty) != len(s.nodes) {
		s.empty = s.empty[:0]
		s.refusals = map[string]string{}
		for _, n := range s.nodeList() {
			s.empty = append(s.empty, s.buildView(n, func(u *unitState, d *placement.DeviceView) {
				d.Usable, d.Whole, d.FreeMilli, d.FreeMemory = !u.dev.MIGMode, true, 1000, u.dev.MemoryBytes
			}))
		}
	}
	// The answer depends only on the request while the nodes stay: kept.
	key := fmt.Sprintf("%d|%d|%d|%s|%+v", ls.req.GPUs, ls.req.MilliGPU, ls.req.MemoryBytes, ls.req.MIG, ls.req.Constraints)
	if r, ok := s.refusals[key]; ok {
		return r
	}
	reason := ""
	if _, err := s.cfg.Placer.Place(ls.req, s.empty); err != nil {
		reason = "no node could ever hold it: " + err.Error()
		if nf := (*placement.NoFit)(nil); errors.As(err, &nf) && nf.Wanted != "" {
			reason = "no node could ever hold it: " + nf.Wanted
			if nf.Why != "" {
				reason += ": " + nf.Why
			}
		}
	}
	if len(s.refusals) >= 1024 {
		s.refusals = map[string]string{}
	}
	s.refusals[key] = reason
	return reason
}

// imageNodes asks the image checker which nodes run the image.
func (s *Server) imageNodes(r *http.Request, image string) ([]string, error) {
	s.mu.Lock()
	type nd struct {
		id  string
		rec *store.NodeRecord
	}
	var ns []nd
	for id, n := range s.nodes {
		rec := n.rec
		ns = append(ns, nd{id, &rec})
	}
	s.mu.Unlock()
	out := []string{}
	for _, n := range ns {
		ok, _, err := s.cfg.Images.Runs(r.Context(), image, n.rec.Snapshot)
		if err != nil {
			return nil, fmt.Errorf("checking image %s: %w", image, err)
		}
		if ok {
			out = append(out, n.id)
		}
	}
	return out, nil
}

// leaseByID finds a lease the caller may see (404 otherwise: a member does
// not learn that another project's lease exists).
func (s *Server) leaseByID(r *http.Request, id string) (*api.Lease, bool, error) {
	c := callerOf(r)
	if ls := s.leases[id]; ls != nil {
		if !c.canSee(ls.l.Project) {
			return nil, false, errStatus(http.StatusNotFound, "lease %s not found", id)
		}
		return ls.l, true, nil
	}
	var l *api.Lease
	err := s.st.View(r.Context(), func(tx *store.Tx) error {
		var err error
		l, err = tx.Lease(id)
		return err
	})
	if errors.Is(err, store.ErrNotFound) || (err == nil && !c.canSee(l.Project)) {
		return nil, false, errStatus(http.StatusNotFound, "lease %s not found", id)
	}
	return l, false, err
}

func (s *Server) getLease(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	wait, err := queryFloat(r, "wait_s", 0, 300, 0)
	if err != nil {
		writeErr(w, 0, err)
		return
	}
	since := r.URL.Query().Get("since")
	deadline := time.Now().Add(time.Duration(wait * float64(time.Second)))
	for {
		s.mu.Lock()
		l, _, err := s.leaseByID(r, id)
		if err != nil {
			s.mu.Unlock()
			writeErr(w, http.StatusInternalServerError, err)
			return
		}
		s.decorate(l, time.Now())
		b, _ := json.Marshal(l)
		key := fmt.Sprintf("%s/%d", l.State, l.QueuePosition)
		ch := s.changed
		seq := s.wseq
		s.mu.Unlock()
		left := time.Until(deadline)
		if since == "" || key != since || left <= 0 {
			if err := s.durable(seq); err != nil {
				writeErr(w, http.StatusServiceUnavailable, err)
				return
			}
			w.Header().Set("X-Kiln-Lease-Version", key)
			writeRaw(w, http.StatusOK, b)
			return
		}
		t := time.NewTimer(min(left, time.Second))
		select {
		case <-ch:
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
		t.Stop()
	}
}

func (s *Server) listLeases(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	q := r.URL.Query()
	all := isTrue(q.Get("all"))
	project := q.Get("project")
	state := q.Get("state")
	s.mu.Lock()
	now := time.Now()
	var out []api.Lease
	for _, ls := range s.leases {
		l := ls.l
		if !c.canSee(l.Project) || (project != "" && l.Project != project) || (state != "" && l.State != state) {
			continue
		}
		s.decorate(l, now)
		out = append(out, *l)
	}
	seq := s.wseq
	s.mu.Unlock()
	if err := s.durable(seq); err != nil {
		writeErr(w, http.StatusServiceUnavailable, err)
		return
	}
	if all || (state != "" && api.LeaseFinal(state)) {
		f := store.LeaseFilter{Limit: 500}
		if state != "" {
			f.States = []string{state}
		} else {
			f.States = []string{api.LeaseDone, api.LeaseCancelled, api.LeaseRefused, api.LeasePreempted, api.LeaseExpired, api.LeaseLost}
		}
		if project != "" {
			f.Projects = []string{project}
		} else if !c.admin() {
			f.Projects = append([]string{}, c.user.Projects...)
			if len(f.Projects) == 0 {
				f.Projects = []string{"\x00none"}
			}
		}
		var old []*api.Lease
		err := s.st.View(r.Context(), func(tx *store.Tx) error {
			var err error
			old, err = tx.Leases(f)
			return err
		})
		if err != nil {
			writeErr(w, http.StatusInternalServerError, err)
			return
		}
		seen := map[string]bool{}
		for _, l := range out {
			seen[l.ID] = true
		}
		for _, l := range old {
			if !seen[l.ID] && c.canSee(l.Project) && (l.State != api.LeaseLost || !seen[l.ID]) {
				out = append(out, *l)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	if out == nil {
		out = []api.Lease{}
	}
	writeJSON(w, http.StatusOK, api.LeaseList{Leases: out})
}

func (s *Server) cancelLease(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	id := r.PathValue("id")
	s.answer(w, http.StatusOK, func() (any, uint64, error) {
		if err := s.down(); err != nil {
			return nil, 0, withStatus(http.StatusServiceUnavailable, err)
		}
		l, live, err := s.leaseByID(r, id)
		if err != nil {
			return nil, 0, err
		}
		if !live {
			return l, 0, nil
		}
		now := time.Now()
		b := newBatch()
		ls := s.leases[id]
		switch l.State {
		case api.LeaseQueued:
			s.finishLease(ls, api.LeaseCancelled, "cancelled by "+c.user.Name, now, b)
		case api.LeaseGranted:
			s.stopLease(ls, api.LeaseDone, "released by "+c.user.Name, s.cfg.PreemptGrace, now, b)
		case api.LeaseLost:
			if !c.admin() {
				return nil, 0, errStatus(http.StatusConflict, "lease %s is lost with its node; an admin clears it with 'kiln drain --clear-lost %s'", id, l.Allocations[0].Node)
			}
		}
		s.schedule(now, b)
		seq, err := s.flush(b)
		if err != nil {
			return nil, 0, withStatus(http.StatusServiceUnavailable, err)
		}
		return l, seq, nil
	})
}

func (s *Server) addJob(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	body, err := readBody(r, maxBody)
	if err != nil {
		writeErr(w, 0, badRequest(err))
		return
	}
	var spec api.JobSpec
	if err := decodeJSON(body, &spec); err != nil {
		writeErr(w, 0, badRequest(err))
		return
	}
	if err := checkJobSpec(&spec); err != nil {
		writeErr(w, 0, badRequest(err))
		return
	}
	s.answer(w, http.StatusCreated, func() (any, uint64, error) {
		if err := s.down(); err != nil {
			return nil, 0, withStatus(http.StatusServiceUnavailable, err)
		}
		l, live, err := s.leaseByID(r, id)
		if err != nil {
			return nil, 0, err
		}
		if !live || (l.State != api.LeaseQueued && l.State != api.LeaseGranted) {
			return nil, 0, errStatus(http.StatusConflict, "lease %s is %s: jobs run only in a queued or granted lease", id, l.State)
		}
		ls := s.leases[id]
		if err := s.jobRoom(l.Project, &spec, len(ls.jobs)); err != nil {
			return nil, 0, err
		}
		now := time.Now()
		j := &api.Job{ID: newID("j-"), LeaseID: id, Project: l.Project, State: api.JobPending, Spec: spec, Created: now.UTC()}
		js := &jobState{j: j, lease: ls}
		ls.jobs = append(ls.jobs, js)
		l.Jobs = append(l.Jobs, j.ID)
		s.jobs[j.ID] = js
		b := newBatch()
		b.job(j)
		b.lease(l)
		if l.State == api.LeaseGranted {
			s.assign(js, b)
		}
		seq, err := s.flush(b)
		if err != nil {
			return nil, 0, withStatus(http.StatusServiceUnavailable, err)
		}
		return j, seq, nil
	})
}

// jobByID finds a job the caller may see.
func (s *Server) jobByID(r *http.Request, id string) (*api.Job, error) {
	c := callerOf(r)
	if js := s.jobs[id]; js != nil {
		if !c.canSee(js.j.Project) {
			return nil, errStatus(http.StatusNotFound, "job %s not found", id)
		}
		return js.j, nil
	}
	var j *api.Job
	err := s.st.View(r.Context(), func(tx *store.Tx) error {
		var err error
		j, err = tx.Job(id)
		return err
	})
	if errors.Is(err, store.ErrNotFound) || (err == nil && !c.canSee(j.Project)) {
		return nil, errStatus(http.StatusNotFound, "job %s not found", id)
	}
	return j, err
}

func (s *Server) getJob(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	j, err := s.jobByID(r, r.PathValue("id"))
	var b []byte
	if err == nil {
		b, err = json.Marshal(j)
	}
	seq := s.wseq
	s.mu.Unlock()
	if err == nil {
		err = s.durable(seq)
	}
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	writeRaw(w, http.StatusOK, b)
}

func (s *Server) jobLogs(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	follow := isTrue(r.URL.Query().Get("follow"))
	s.mu.Lock()
	_, err := s.jobByID(r, id)
	s.mu.Unlock()
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	var off int64
	for {
		ch := s.logs.wait(id)
		n, err := s.logs.copy(w, id, off)
		off += n
		if err != nil {
			return
		}
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
		if !follow {
			return
		}
		s.mu.Lock()
		js := s.jobs[id]
		finished := js == nil || api.JobFinal(js.j.State)
		s.mu.Unlock()
		if finished {
			// One more read: output written just before the end.
			n, _ := s.logs.copy(w, id, off)
			off += n
			return
		}
		t := time.NewTimer(2 * time.Second)
		select {
		case <-ch:
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
		t.Stop()
	}
}
