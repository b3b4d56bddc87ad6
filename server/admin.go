package server

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sort"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/store"
)

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	out := api.NodeList{Nodes: s.core.Nodes()}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getNode(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	nd, ok := s.core.NodeInfo(r.PathValue("id"))
	s.mu.Unlock()
	if !ok {
		writeErr(w, http.StatusNotFound, fmt.Errorf("node %s not found", r.PathValue("id")))
		return
	}
	writeJSON(w, http.StatusOK, nd)
}

func (s *Server) drainNode(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	id := r.PathValue("id")
	req, ok := readRequest(w, r, maxBody, parseDrain)
	if !ok {
		return
	}
	if !s.lockForChange(w) {
		return
	}
	defer s.mu.Unlock()
	nd, b, err := s.core.Drain(time.Now(), id, req.Devices, req.Undrain, req.ClearLost, req.Reason, c.user.Name)
	if !s.written(w, b, err) {
		return
	}
	writeJSON(w, http.StatusOK, nd)
}

func (s *Server) listProjects(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	s.mu.Lock()
	out := s.core.Projects(time.Now(), c.canSee)
	var members map[string][]string
	err := s.st.View(r.Context(), func(tx *store.Tx) error {
		ps, err := tx.Projects()
		members = map[string][]string{}
		for _, p := range ps {
			members[p.Name] = p.Members
		}
		return err
	})
	for i := range out {
		out[i].Members = members[out[i].Name]
	}
	s.mu.Unlock()
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"projects": out})
}

func (s *Server) putProject(w http.ResponseWriter, r *http.Request) {
	p, ok := readRequest(w, r, maxBody, parseProject)
	if !ok {
		return
	}
	if p.Name != r.PathValue("name") {
		writeErr(w, http.StatusBadRequest, fmt.Errorf("name %q differs from the path's %q", p.Name, r.PathValue("name")))
		return
	}
	if p.Weight == 0 {
		p.Weight = 1
	}
	if p.PeriodSeconds == 0 {
		p.PeriodSeconds = 30 * 24 * 3600
	}
	if !s.lockForChange(w) {
		return
	}
	defer s.mu.Unlock()
	var userIDs []string
	for _, m := range p.Members {
		u := s.byName[m]
		if u == nil {
			writeErr(w, http.StatusBadRequest, fmt.Errorf("member %s: no such user (create one with 'kiln token create --user %s')", m, m))
			return
		}
		userIDs = append(userIDs, u.ID)
	}
	err := s.st.Update(r.Context(), func(tx *store.Tx) error {
		if err := tx.PutProject(p); err != nil {
			return err
		}
		for _, id := range userIDs {
			if err := tx.AddMember(p.Name, id); err != nil {
				return err
			}
		}
		return tx.AddEvent(api.Event{Kind: "project.put", Subject: p.Name, Project: p.Name, Message: fmt.Sprintf("weight %g, max %g GPUs, %g GPU-hours per %ds", p.Weight, p.MaxGPUs, p.GPUHours, p.PeriodSeconds)})
	})
	if err != nil {
		writeErr(w, 0, storeErr(err))
		return
	}
	members := p.Members
	p.Members = nil
	b := s.core.PutProject(time.Now(), p)
	for _, m := range members {
		u := s.byName[m].User
		if !slices.Contains(u.Projects, p.Name) {
			u.Projects = append(append([]string(nil), u.Projects...), p.Name)
		}
		s.putUser(u) // a new value: callers may read the old one unlocked
	}
	if err := s.flushWait(b); err != nil {
		writeErr(w, http.StatusServiceUnavailable, err)
		return
	}
	p.Members = members
	writeJSON(w, http.StatusOK, p)
}

func (s *Server) listUsers(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	out := []api.User{}
	for _, u := range s.users {
		out = append(out, u.User)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	writeJSON(w, http.StatusOK, map[string]any{"users": out})
}

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	s.mu.Lock()
	out := []api.Token{}
	for _, t := range s.tokens {
		u := s.users[t.UserID]
		if u == nil || (!c.admin() && u.ID != c.user.ID) {
			continue
		}
		tok := api.Token{ID: t.ID, User: u.Name, Name: t.Name, Created: t.Created}
		if !t.Expires.IsZero() {
			e := t.Expires
			tok.Expires = &e
		}
		out = append(out, tok)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	writeJSON(w, http.StatusOK, map[string]any{"tokens": out})
}

// createToken makes an API token. A member makes tokens for themself; an
// admin for anyone, creating the user (with a role and projects) when new.
func (s *Server) createToken(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	req, ok := readRequest(w, r, maxBody, parseTokenRequest)
	if !ok {
		return
	}
	if !s.lockForChange(w) {
		return
	}
	defer s.mu.Unlock()
	name := req.User
	if name == "" {
		name = c.user.Name
	}
	if !c.admin() && (name != c.user.Name || req.Role != "" || len(req.Projects) > 0) {
		writeErr(w, http.StatusForbidden, errors.New("a member may only make tokens for themself, with no role or project change"))
		return
	}
	for _, p := range req.Projects {
		if !s.core.HasProject(p) {
			writeErr(w, http.StatusNotFound, fmt.Errorf("project %s does not exist (create it with 'kiln token project %s')", p, p))
			return
		}
	}
	now := time.Now().UTC()
	u := s.byName[name]
	var user api.User
	if u == nil {
		role := req.Role
		if role == "" {
			role = api.RoleMember
		}
		user = api.User{ID: "u-" + randHex(6), Name: name, Role: role, Created: now}
	} else {
		user = u.User
		user.Projects = append([]string(nil), u.Projects...)
		if req.Role != "" {
			user.Role = req.Role
		}
		if u.Role == api.RoleAdmin && user.Role != api.RoleAdmin && s.admins() <= 1 {
			writeErr(w, http.StatusConflict, lastAdminErr(u.Name, "demoted"))
			return
		}
	}
	for _, p := range req.Projects {
		if !slices.Contains(user.Projects, p) {
			user.Projects = append(user.Projects, p)
		}
	}
	id := randHex(6)
	secret, hash := newSecret()
	row := store.TokenRow{ID: id, UserID: user.ID, Name: req.Name, Hash: hash, Created: now}
	if req.TTLSeconds > 0 {
		// parseTokenRequest bounds the TTL, so this cannot overflow.
		row.Expires = now.Add(time.Duration(req.TTLSeconds) * time.Second)
	}
	err := s.st.Update(r.Context(), func(tx *store.Tx) error {
		if err := tx.PutUser(user); err != nil {
			return err
		}
		for _, p := range user.Projects {
			if err := tx.AddMember(p, user.ID); err != nil {
				return err
			}
		}
		if err := tx.PutToken(row); err != nil {
			return err
		}
		return tx.AddEvent(api.Event{Kind: "token.created", Subject: user.Name, Message: fmt.Sprintf("%s made token %s for %s (%s)", c.user.Name, id, user.Name, user.Role)})
	})
	if err != nil {
		writeErr(w, 0, storeErr(err))
		return
	}
	s.putUser(user)
	s.amu.Lock()
	s.tokens[id] = &tokenInfo{row}
	s.amu.Unlock()
	tok := api.Token{ID: id, User: user.Name, Name: req.Name, Secret: apiTokenPrefix + id + "_" + secret, Created: now}
	if !row.Expires.IsZero() {
		tok.Expires = &row.Expires
	}
	writeJSON(w, http.StatusCreated, tok)
}

func (s *Server) deleteToken(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	id := r.PathValue("id")
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tokens[id]
	if t == nil || (!c.admin() && t.UserID != c.user.ID) {
		writeErr(w, http.StatusNotFound, fmt.Errorf("token %s not found", id))
		return
	}
	if u := s.users[t.UserID]; u != nil && u.Role == api.RoleAdmin && s.admins() <= 1 && s.liveTokens(u.ID, time.Now()) <= 1 {
		writeErr(w, http.StatusConflict, fmt.Errorf("token %s is the last token of %s, the last admin: make another token first ('kiln token create'), or recover on the server's host with 'kiln server --reset-admin'", id, u.Name))
		return
	}
	err := s.st.Update(r.Context(), func(tx *store.Tx) error {
		if err := tx.DeleteToken(id); err != nil {
			return err
		}
		return tx.AddEvent(api.Event{Kind: "token.deleted", Subject: id, Message: c.user.Name + " deleted token " + id})
	})
	if err != nil {
		writeErr(w, 0, storeErr(err))
		return
	}
	s.amu.Lock()
	delete(s.tokens, id)
	s.amu.Unlock()
	writeJSON(w, http.StatusOK, map[string]string{"deleted": id})
}

// admins counts the users with the admin role; s.mu is held.
func (s *Server) admins() int {
	n := 0
	for _, u := range s.users {
		if u.Role == api.RoleAdmin {
			n++
		}
	}
	return n
}

// liveTokens counts a user's tokens that have not expired; s.mu is held.
func (s *Server) liveTokens(userID string, now time.Time) int {
	n := 0
	for _, t := range s.tokens {
		if t.UserID == userID && (t.Expires.IsZero() || now.Before(t.Expires)) {
			n++
		}
	}
	return n
}

// storeErr is the answer to a store write that failed: 503, as the
// committer's failures are (the disk is full, most likely).
func storeErr(err error) error {
	return withStatus(http.StatusServiceUnavailable, fmt.Errorf("the store cannot write (is the disk full?): %w", err))
}

func lastAdminErr(name, what string) error {
	return &httpError{http.StatusConflict, fmt.Errorf("%s is the last admin and may not be %s: make another admin first ('kiln token create --user NAME --role admin'), or recover on the server's host with 'kiln server --reset-admin'", name, what)}
}

// deleteUser removes a user with its tokens and memberships; the leases it
// made stay (under its name).
func (s *Server) deleteUser(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	name := r.PathValue("name")
	if !s.lockForChange(w) {
		return
	}
	defer s.mu.Unlock()
	u := s.byName[name]
	if u == nil {
		writeErr(w, http.StatusNotFound, fmt.Errorf("user %s not found", name))
		return
	}
	if u.Role == api.RoleAdmin && s.admins() <= 1 {
		writeErr(w, 0, lastAdminErr(u.Name, "removed"))
		return
	}
	err := s.st.Update(r.Context(), func(tx *store.Tx) error {
		if err := tx.DeleteUser(u.ID); err != nil {
			return err
		}
		return tx.AddEvent(api.Event{Kind: "user.deleted", Subject: u.Name, Message: fmt.Sprintf("%s removed user %s and its tokens", c.user.Name, u.Name)})
	})
	if err != nil {
		writeErr(w, 0, storeErr(err))
		return
	}
	s.amu.Lock()
	delete(s.users, u.ID)
	delete(s.byName, u.Name)
	for id, t := range s.tokens {
		if t.UserID == u.ID {
			delete(s.tokens, id)
		}
	}
	s.amu.Unlock()
	writeJSON(w, http.StatusOK, map[string]string{"deleted": u.Name})
}

func (s *Server) createJoinToken(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	body, err := readBody(r, maxBody)
	if err != nil {
		writeErr(w, 0, badRequest(err))
		return
	}
	var req api.JoinTokenRequest
	if len(body) > 0 {
		if err := decodeJSON(body, &req); err != nil {
			writeErr(w, 0, badRequest(err))
			return
		}
	}
	if req.TTLSeconds < 0 || req.TTLSeconds > maxJoinTTL {
		writeErr(w, http.StatusBadRequest, fmt.Errorf("ttl_s %d: want 0 (one hour) to %d (one year)", req.TTLSeconds, maxJoinTTL))
		return
	}
	if req.Uses < 0 || req.Uses > maxJoinUses {
		writeErr(w, http.StatusBadRequest, fmt.Errorf("uses %d: want 0 (one node) to %d", req.Uses, maxJoinUses))
		return
	}
	jt, err := s.newJoinToken(r.Context(), time.Duration(req.TTLSeconds)*time.Second, req.Uses, c.user.Name)
	if err != nil {
		writeErr(w, 0, storeErr(err))
		return
	}
	writeJSON(w, http.StatusCreated, jt)
}

func (s *Server) listJoinTokens(w http.ResponseWriter, r *http.Request) {
	var rows []store.JoinTokenRow
	err := s.st.View(r.Context(), func(tx *store.Tx) error {
		var err error
		rows, err = tx.JoinTokens()
		return err
	})
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	out := []api.JoinToken{}
	for _, t := range rows {
		jt := api.JoinToken{ID: t.ID, Created: t.Created, Expires: t.Expires, Uses: t.Uses, Used: t.Used}
		if !t.Revoked.IsZero() {
			rv := t.Revoked
			jt.Revoked = &rv
		}
		out = append(out, jt)
	}
	writeJSON(w, http.StatusOK, map[string]any{"join_tokens": out})
}

func (s *Server) revokeJoinToken(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	id := r.PathValue("id")
	err := s.st.Update(r.Context(), func(tx *store.Tx) error {
		if err := tx.RevokeJoinToken(id, time.Now().UTC()); err != nil {
			return err
		}
		return tx.AddEvent(api.Event{Kind: "join-token.revoked", Subject: id, Message: c.user.Name + " revoked join token " + id})
	})
	if errors.Is(err, store.ErrNotFound) {
		writeErr(w, http.StatusNotFound, fmt.Errorf("join token %s not found (or revoked already)", id))
		return
	}
	if err != nil {
		writeErr(w, 0, storeErr(err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"revoked": id})
}

func (s *Server) listEvents(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	after, err := queryInt(r, "after", 0, math.MaxInt64, 0)
	if err != nil {
		writeErr(w, 0, err)
		return
	}
	limit, err := queryInt(r, "limit", 0, 10000, 0)
	if err != nil {
		writeErr(w, 0, err)
		return
	}
	var projects []string
	if !c.admin() {
		s.mu.Lock()
		projects = append([]string{}, c.user.Projects...)
		s.mu.Unlock()
		if len(projects) == 0 {
			writeJSON(w, http.StatusOK, map[string]any{"events": []api.Event{}})
			return
		}
	}
	var evs []api.Event
	err = s.st.View(r.Context(), func(tx *store.Tx) error {
		var err error
		evs, err = tx.Events(after, projects, int(limit))
		return err
	})
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	if evs == nil {
		evs = []api.Event{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"events": evs})
}
