package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/lease"
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
	s.change(w, http.StatusCreated, func() (any, uint64, error) {
		now := time.Now()
		l, b, err := s.core.Submit(now, lease.Submit{Request: req, User: c.user.Name, Projects: c.user.Projects, Member: c.canSee, Allowed: allowed})
		if err != nil {
			return nil, 0, err
		}
		seq, err := s.flush(b)
		if err != nil {
			return nil, 0, withStatus(http.StatusServiceUnavailable, err)
		}
		s.core.Decorate(l, now)
		return l, seq, nil
	})
}

// imageNodes asks the image checker which nodes run the image.
func (s *Server) imageNodes(r *http.Request, image string) ([]string, error) {
	s.mu.Lock()
	snaps := s.core.Snapshots()
	s.mu.Unlock()
	out := []string{}
	for id, snap := range snaps {
		ok, _, err := s.cfg.Images.Runs(r.Context(), image, snap)
		if err != nil {
			return nil, fmt.Errorf("checking image %s: %w", image, err)
		}
		if ok {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out, nil
}

// leaseByID finds a lease the caller may see (404 otherwise: a member does
// not learn that another project's lease exists).
func (s *Server) leaseByID(r *http.Request, id string) (*api.Lease, bool, error) {
	c := callerOf(r)
	if l := s.core.Lease(id); l != nil {
		if !c.canSee(l.Project) {
			return nil, false, errStatus(http.StatusNotFound, "lease %s not found", id)
		}
		return l, true, nil
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
		s.core.Decorate(l, time.Now())
		out := s.withDeployment(*l)
		b, _ := json.Marshal(out)
		key := fmt.Sprintf("%s/%d", l.State, l.QueuePosition)
		if out.Deployment != nil {
			key += "/" + out.Deployment.State
		}
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
		if !waitFor(r.Context(), ch, min(left, time.Second)) {
			return
		}
	}
}

func (s *Server) listLeases(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	q := r.URL.Query()
	all := isTrue(q.Get("all"))
	project := q.Get("project")
	state := q.Get("state")
	s.mu.Lock()
	out := s.core.Leases(time.Now(), func(l *api.Lease) bool {
		return c.canSee(l.Project) && (project == "" || l.Project == project) && (state == "" || l.State == state)
	})
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
	for i := range out {
		out[i] = s.withDeployment(out[i])
	}
	writeJSON(w, http.StatusOK, api.LeaseList{Leases: out})
}

func (s *Server) cancelLease(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	id := r.PathValue("id")
	s.change(w, http.StatusOK, func() (any, uint64, error) {
		l, live, err := s.leaseByID(r, id)
		if err != nil {
			return nil, 0, err
		}
		if !live {
			return l, 0, nil
		}
		l, b, err := s.core.Cancel(time.Now(), id, c.user.Name, c.admin())
		if err != nil {
			return nil, 0, err
		}
		return s.commit(b, l)
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
	s.change(w, http.StatusCreated, func() (any, uint64, error) {
		l, live, err := s.leaseByID(r, id)
		if err != nil {
			return nil, 0, err
		}
		if !live {
			return nil, 0, errStatus(http.StatusConflict, "lease %s is %s: jobs run only in a queued or granted lease", id, l.State)
		}
		j, b, err := s.core.AddJob(time.Now(), id, spec)
		if err != nil {
			return nil, 0, err
		}
		return s.commit(b, j)
	})
}

// jobByID finds a job the caller may see.
func (s *Server) jobByID(r *http.Request, id string) (*api.Job, error) {
	c := callerOf(r)
	if j := s.core.Job(id); j != nil {
		if !c.canSee(j.Project) {
			return nil, errStatus(http.StatusNotFound, "job %s not found", id)
		}
		return j, nil
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
		j := s.core.Job(id)
		finished := j == nil || api.JobFinal(j.State)
		s.mu.Unlock()
		if finished {
			// One more read: output written just before the end.
			n, _ := s.logs.copy(w, id, off)
			off += n
			return
		}
		if !waitFor(r.Context(), ch, 2*time.Second) {
			return
		}
	}
}
