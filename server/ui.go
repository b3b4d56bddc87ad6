package server

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/compat"
	"kiln.dev/kiln/doctor"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/topo"
)

// The web page at /ui/ shows the fleet, each node's wiring, the queue and
// the projects, live. Every asset is embedded (no CDN) and served under a
// strict content security policy. A browser cannot hold kiln's bearer
// token, so 'kiln ui' asks for a link (POST /v1/ui/link) with a one-time
// code that the first visit trades for a session cookie (HttpOnly,
// Secure, SameSite=Strict, path /ui/): neither the browser's history nor a
// script ever holds the token. The cookie is checked on every request as
// the token it came from is: revoking the token ends the session.

//go:embed uiassets
var uiFiles embed.FS

const (
	uiCodeTTL     = 2 * time.Minute
	uiSessionTTL  = 12 * time.Hour
	uiCookie      = "kiln_ui_session"
	uiCodeParam   = "kiln_code"
	maxUISessions = 10000
	// uiCSP lets the page load only its own scripts, styles and data.
	uiCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
		"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

// recentPoints is how much of each GPU's history the node page draws
// beside it: a quarter of an hour.
const recentPoints = int(15 * time.Minute / historyStep)

// uiAssets are the files under /ui/ that are not the page itself.
var uiAssets = map[string]bool{"app.js": true, "app.css": true}

type uiSession struct {
	token   string
	expires time.Time
}

type uiSessions struct {
	mu    sync.Mutex
	codes map[string]*uiSession
	live  map[string]*uiSession
}

func newUISessions() *uiSessions {
	return &uiSessions{codes: map[string]*uiSession{}, live: map[string]*uiSession{}}
}

func (u *uiSessions) sweep(now time.Time) {
	for k, s := range u.codes {
		if now.After(s.expires) {
			delete(u.codes, k)
		}
	}
	for k, s := range u.live {
		if now.After(s.expires) {
			delete(u.live, k)
		}
	}
}

func (u *uiSessions) newCode(token string) (string, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.sweep(time.Now())
	if len(u.codes)+len(u.live) >= maxUISessions {
		return "", errStatus(http.StatusTooManyRequests, "too many web sessions: try again later")
	}
	code := randHex(16)
	u.codes[code] = &uiSession{token: token, expires: time.Now().Add(uiCodeTTL)}
	return code, nil
}

// trade turns a code into a session id, once.
func (u *uiSessions) trade(code string) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	s := u.codes[code]
	delete(u.codes, code)
	if s == nil || time.Now().After(s.expires) {
		return ""
	}
	id := randHex(24)
	u.live[id] = &uiSession{token: s.token, expires: time.Now().Add(uiSessionTTL)}
	return id
}

func (u *uiSessions) token(id string) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	s := u.live[id]
	if s == nil || time.Now().After(s.expires) {
		return ""
	}
	return s.token
}

// uiLink is POST /v1/ui/link: a link that signs a browser in as the
// caller.
func (s *Server) uiLink(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	code, err := s.uiSessions.newCode(c.token)
	if err != nil {
		writeErr(w, 0, err)
		return
	}
	link := fmt.Sprintf("%s/ui/?%s=%s", strings.TrimRight(s.cfg.URL, "/"), uiCodeParam, code)
	writeJSON(w, http.StatusCreated, api.BrowserLink{URL: link, Expires: time.Now().Add(uiCodeTTL).UTC()})
}

// uiCaller is the user of a web session, or nil.
func (s *Server) uiCaller(r *http.Request) *caller {
	ck, err := r.Cookie(uiCookie)
	if err != nil {
		return nil
	}
	tok := s.uiSessions.token(ck.Value)
	if tok == "" {
		return nil
	}
	s.amu.RLock()
	defer s.amu.RUnlock()
	if u := s.tokenUser(tok, time.Now()); u != nil {
		return &caller{user: u, token: tok}
	}
	return nil
}

// uiHandler serves /ui/.
func (s *Server) uiHandler() http.Handler {
	assets, err := fs.Sub(uiFiles, "uiassets")
	if err != nil {
		panic(err) // the embedded tree is part of the binary
	}
	files := http.FileServerFS(assets)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ui/api/fleet", s.uiAPI(s.uiFleet))
	mux.HandleFunc("GET /ui/api/nodes/{id}", s.uiAPI(s.uiNode))
	mux.HandleFunc("GET /ui/api/nodes/{id}/gpus/{index}", s.uiAPI(s.uiGPU))
	mux.HandleFunc("GET /ui/api/leases/{id}", s.uiAPI(s.uiLease))
	mux.HandleFunc("GET /ui/api/events", s.uiAPI(s.uiEvents))
	mux.HandleFunc("GET /ui/{path...}", func(w http.ResponseWriter, r *http.Request) {
		if code := r.URL.Query().Get(uiCodeParam); code != "" {
			if s.limited(w, r) {
				return
			}
			id := s.uiSessions.trade(code)
			if id == "" {
				writeErr(w, http.StatusUnauthorized, errors.New("this sign-in link was used or is too old: run 'kiln ui' for another"))
				return
			}
			http.SetCookie(w, &http.Cookie{Name: uiCookie, Value: id, Path: "/ui/", MaxAge: int(uiSessionTTL / time.Second),
				HttpOnly: true, Secure: true, SameSite: http.SameSiteStrictMode})
			w.Header().Set("Cache-Control", "no-store")
			http.Redirect(w, r, "/ui/", http.StatusSeeOther)
			return
		}
		// Every page is the one document; the script draws the page its
		// address names (/ui/, /ui/nodes/NAME, /ui/queue). Node names may
		// hold dots: only the assets' own names are files.
		r = r.Clone(r.Context())
		r.URL.Path = "/"
		if p := r.PathValue("path"); uiAssets[p] {
			r.URL.Path = "/" + p
		}
		files.ServeHTTP(w, r)
	})
	return uiHeaders(mux)
}

func uiHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", uiCSP)
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("X-Frame-Options", "DENY")
		h.ServeHTTP(w, r)
	})
}

// uiAPI runs fn for a signed-in browser.
func (s *Server) uiAPI(fn func(w http.ResponseWriter, r *http.Request, c *caller)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c := s.uiCaller(r)
		if c == nil {
			if s.limited(w, r) {
				return
			}
			writeErr(w, http.StatusUnauthorized, errors.New("not signed in: run 'kiln ui' and open the link it prints"))
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		fn(w, r, c)
	}
}

// UI views: what the page draws, made by the server so that totals are
// the sums of their rows.
type (
	uiFleet struct {
		User     string      `json:"user"`
		Nodes    []uiNodeRow `json:"nodes"`
		Totals   uiTotals    `json:"totals"`
		Projects []uiProject `json:"projects"`
		Queue    []uiQueued  `json:"queue"`
		// FleetFindings are what only the view of every node shows
		// (doctor.Fleet).
		FleetFindings []uiFleetFinding `json:"fleet_findings"`
		At            time.Time        `json:"at"`
	}
	uiFleetFinding struct {
		ID       string   `json:"id"`
		Severity string   `json:"severity"`
		Title    string   `json:"title"`
		Evidence []string `json:"evidence"`
		Remedy   string   `json:"remedy"`
		Nodes    string   `json:"nodes"`
	}
	uiTotals struct {
		Nodes, Ready, GPUs, Held, Free, Drained int
		Findings                                map[string]int
	}
	uiNodeRow struct {
		ID       string         `json:"id"`
		State    string         `json:"state"`
		Hostname string         `json:"hostname,omitempty"`
		Recorded bool           `json:"recorded,omitempty"`
		LastSeen time.Time      `json:"last_seen"`
		GPUs     []uiGPU        `json:"gpus"`
		Findings map[string]int `json:"findings"`
		Held     int            `json:"held"`
		Free     int            `json:"free"`
		Drained  int            `json:"drained"`
	}
	uiGPU struct {
		ID      string `json:"id"`
		Index   int    `json:"index"`
		Model   string `json:"model,omitempty"`
		PCI     string `json:"pci,omitempty"`
		NUMA    *int   `json:"numa,omitempty"`
		Island  string `json:"island,omitempty"`
		MIG     string `json:"mig,omitempty"`
		Parent  string `json:"parent,omitempty"`
		Drained bool   `json:"drained,omitempty"`
		// UsedMilli is how much of it leases hold; Projects who (names
		// of projects the viewer may not see are "another project").
		UsedMilli int      `json:"used_milli"`
		Projects  []string `json:"projects,omitempty"`
		// Leases are the ones holding it that the viewer may see.
		Leases      []string `json:"leases,omitempty"`
		Utilization *float64 `json:"utilization,omitempty"`
		// Processes use it now, by the agent's last reading.
		Processes *int `json:"processes,omitempty"`
	}
	uiProject struct {
		Name   string  `json:"name"`
		Held   float64 `json:"held"`
		Limit  float64 `json:"limit,omitempty"`
		Queued int     `json:"queued"`
		// Share is its weight over every project's: its part of the
		// cluster while every project waits.
		Share float64 `json:"share"`
		// Busy is the mean utilisation (percent) of the GPUs it holds
		// that report one; nil when none does.
		Busy      *float64 `json:"busy,omitempty"`
		UsedHours float64  `json:"used_hours"`
	}
	uiQueued struct {
		ID             string     `json:"id"`
		Project        string     `json:"project"`
		User           string     `json:"user,omitempty"`
		Size           string     `json:"size"`
		Position       int        `json:"position"`
		EstimatedStart *time.Time `json:"estimated_start,omitempty"`
		Reason         string     `json:"reason,omitempty"`
	}
	uiNodeView struct {
		uiNodeRow
		Driver   string        `json:"driver,omitempty"`
		CUDA     string        `json:"cuda,omitempty"`
		Links    []uiLink      `json:"links"`
		NICs     []uiNIC       `json:"nics"`
		NUMA     []int         `json:"numa"`
		Switches []string      `json:"switches"`
		Findings []api.Finding `json:"finding_list"`
		// Recent is each GPU's utilisation over the last quarter hour
		// (by index; one value per history point), for the GPU table.
		Recent map[int][]float64 `json:"recent"`
	}
	uiLink struct {
		A, B      string
		Kind      string  `json:"kind"`
		Count     int     `json:"count,omitempty"`
		GBps      float64 `json:"gbps,omitempty"`
		PerDir    bool    `json:"per_direction"`
		ViaSwitch bool    `json:"via_switch,omitempty"`
		Degraded  bool    `json:"degraded,omitempty"`
		Label     string  `json:"label"`
	}
	uiNIC struct {
		PCI  string `json:"pci"`
		Name string `json:"name,omitempty"`
		NUMA *int   `json:"numa,omitempty"`
	}
)

const otherProject = "another project"

// nodeRow is a node as the fleet page draws it; s.mu is held.
func (s *Server) nodeRow(c *caller, n api.Node, snap *snapshot.Snapshot, projectOf map[string]string) uiNodeRow {
	row := uiNodeRow{ID: n.ID, State: n.State, Hostname: n.Hostname, Recorded: n.Recorded, LastSeen: n.LastSeen, Findings: map[string]int{}}
	for _, f := range n.Findings {
		row.Findings[f.Severity]++
	}
	// The agent's last heartbeat sample, else the node's Snapshot.
	util := map[string]*float64{}
	procs := map[string]*int{}
	if snap != nil {
		latest := s.history.latest(n.ID)
		for _, g := range snap.GPUs {
			p, ok := latest[g.Index]
			if ok && p.hasUtil {
				util[g.PCIAddress] = snapshot.Ptr(float64(p.util))
			} else if g.UtilizationGPU != nil {
				util[g.PCIAddress] = g.UtilizationGPU
			}
			if ok && p.hasProcs {
				procs[g.PCIAddress] = snapshot.Ptr(int(p.procs))
			}
		}
	}
	for _, d := range n.Devices {
		g := uiGPU{ID: d.ID, Index: d.Index, Model: d.Model, PCI: d.PCIAddress, NUMA: d.NUMANode, Island: d.Island, MIG: d.MIGProfile,
			Parent: d.Parent, Drained: d.Drained, UsedMilli: d.UsedMilli, Utilization: util[d.PCIAddress]}
		if d.Parent == "" {
			g.Processes = procs[d.PCIAddress]
		}
		seen := map[string]bool{}
		for _, id := range d.Leases {
			p := projectOf[id]
			if p == "" || !c.canSee(p) {
				p = otherProject
			} else {
				g.Leases = append(g.Leases, id)
			}
			if !seen[p] {
				seen[p] = true
				g.Projects = append(g.Projects, p)
			}
		}
		sort.Strings(g.Projects)
		row.GPUs = append(row.GPUs, g)
		if d.Parent != "" || d.MIGMode {
			continue // the GPU counts once: as itself, not its instances
		}
		switch {
		case d.Drained:
			row.Drained++
		case d.UsedMilli > 0:
			row.Held++
		default:
			row.Free++
		}
	}
	return row
}

func (s *Server) uiFleet(w http.ResponseWriter, r *http.Request, c *caller) {
	now := time.Now()
	s.mu.Lock()
	nodes := s.core.Nodes()
	snaps := s.core.Snapshots()
	live := s.core.Leases(now, func(*api.Lease) bool { return true })
	projects := s.core.Projects(now, c.canSee)
	all := s.core.Projects(now, func(string) bool { return true })
	s.mu.Unlock()
	projectOf := map[string]string{}
	out := uiFleet{User: c.user.Name, At: now.UTC(), Totals: uiTotals{Findings: map[string]int{}}}
	for _, l := range live {
		projectOf[l.ID] = l.Project
		if l.State == api.LeaseQueued {
			if c.canSee(l.Project) {
				out.Queue = append(out.Queue, uiQueued{ID: l.ID, Project: l.Project, User: l.User, Size: l.Request.Size(),
					Position: l.QueuePosition, EstimatedStart: l.EstimatedStart, Reason: l.Reason})
			}
		}
	}
	sort.Slice(out.Queue, func(i, j int) bool { return out.Queue[i].Position < out.Queue[j].Position })
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].ID < nodes[j].ID })
	for _, n := range nodes {
		row := s.nodeRow(c, n, snaps[n.ID], projectOf)
		out.Nodes = append(out.Nodes, row)
		t := &out.Totals
		t.Nodes++
		if n.State == api.NodeReady {
			t.Ready++
		}
		t.Held += row.Held
		t.Free += row.Free
		t.Drained += row.Drained
		t.GPUs += row.Held + row.Free + row.Drained
		for k, v := range row.Findings {
			t.Findings[k] += v
		}
	}
	total := 0.0
	for _, p := range all {
		total += weightOf(p)
	}
	busy, busyN := map[string]float64{}, map[string]int{}
	for _, n := range out.Nodes {
		for _, g := range n.GPUs {
			if g.Utilization == nil || g.Parent != "" {
				continue
			}
			for _, p := range g.Projects {
				busy[p] += *g.Utilization
				busyN[p]++
			}
		}
	}
	for _, p := range projects {
		up := uiProject{Name: p.Name, Held: p.HeldGPUs, Limit: p.MaxGPUs, Queued: p.QueuedLease, UsedHours: p.UsedHours}
		if total > 0 {
			up.Share = weightOf(p) / total
		}
		if busyN[p.Name] > 0 {
			up.Busy = snapshot.Ptr(busy[p.Name] / float64(busyN[p.Name]))
		}
		out.Projects = append(out.Projects, up)
	}
	out.FleetFindings = []uiFleetFinding{}
	found := doctor.Fleet(snaps)
	if s.cfg.CheckedImages != nil {
		imgs, err := s.cfg.CheckedImages.CheckedImages(r.Context())
		if err != nil {
			// The page goes on without them; the log says why once per call.
			s.log.Warn("the fleet's image findings are left out", "err", err)
		}
		found = append(found, s.imageFleet.findings(imgs, snaps, s.cfg.KB, now)...)
	}
	for _, f := range found {
		out.FleetFindings = append(out.FleetFindings, uiFleetFinding{ID: f.ID, Severity: f.Severity.String(), Title: f.Title,
			Evidence: f.Evidence, Remedy: f.Remedy, Nodes: f.Machine})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) uiNode(w http.ResponseWriter, r *http.Request, c *caller) {
	now := time.Now()
	id := r.PathValue("id")
	s.mu.Lock()
	n, ok := s.core.NodeInfo(id)
	snap := s.core.Snapshots()[id]
	live := s.core.Leases(now, func(*api.Lease) bool { return true })
	s.mu.Unlock()
	if !ok {
		writeErr(w, http.StatusNotFound, fmt.Errorf("node %s not found", id))
		return
	}
	projectOf := map[string]string{}
	for _, l := range live {
		projectOf[l.ID] = l.Project
	}
	v := uiNodeView{uiNodeRow: s.nodeRow(c, n, snap, projectOf), Driver: n.Driver, CUDA: n.CUDA, Findings: n.Findings,
		Links: []uiLink{}, NICs: []uiNIC{}, NUMA: []int{}, Switches: []string{}, Recent: map[int][]float64{}}
	for _, d := range n.Devices {
		if d.Parent != "" {
			continue
		}
		pts := s.history.series(id, d.Index)
		if len(pts) > recentPoints {
			pts = pts[len(pts)-recentPoints:]
		}
		var us []float64
		for _, p := range pts {
			if p.hasUtil {
				us = append(us, float64(p.util))
			}
		}
		if len(us) > 0 {
			v.Recent[d.Index] = us
		}
	}
	if snap != nil {
		numa := map[int]bool{}
		for _, nd := range snap.Host.NUMANodes {
			numa[nd.ID] = true
		}
		for _, g := range snap.GPUs {
			if g.NUMANode != nil {
				numa[*g.NUMANode] = true
			}
		}
		for _, p := range snap.PCI {
			switch p.Kind {
			case snapshot.KindNIC:
				v.NICs = append(v.NICs, uiNIC{PCI: p.Address, Name: p.Interface, NUMA: p.NUMANode})
			case snapshot.KindNVSwitch:
				v.Switches = append(v.Switches, p.Address)
			}
		}
		for k := range numa {
			v.NUMA = append(v.NUMA, k)
		}
		sort.Ints(v.NUMA)
		v.Links = append(v.Links, gpuLinks(snap)...)
		for _, g := range snap.GPUs {
			if pl := g.PCIe; pl != nil && pl.CurrentGen > 0 && pl.MaxGen > 0 {
				lv := uiLink{A: g.PCIAddress, B: "host", Kind: snapshot.LinkPCIe,
					Label: fmt.Sprintf("PCIe Gen%d x%d", pl.CurrentGen, pl.CurrentWidth)}
				lv.Degraded = pl.CurrentWidth < pl.MaxWidth
				v.Links = append(v.Links, lv)
			}
		}
	}
	writeJSON(w, http.StatusOK, v)
}

// gpuLinks are the NVLink and xGMI links between the node's GPUs as
// kiln topo rates them, each labelled with its bandwidth per direction and
// both ways; a GPU whose NVLinks go to NVSwitches is linked through them.
func gpuLinks(snap *snapshot.Snapshot) []uiLink {
	m, err := topo.Build(snap, kb.Default())
	if err != nil {
		return nil
	}
	viaSwitch := map[string]bool{}
	for _, g := range snap.GPUs {
		for _, l := range g.NVLinks {
			if l.RemoteKind == snapshot.KindNVSwitch && l.State == "active" {
				viaSwitch[g.PCIAddress] = true
			}
		}
	}
	var out []uiLink
	for i, a := range m.Devices {
		for j := i + 1; j < len(m.Devices); j++ {
			b, c := m.Devices[j], m.Cells[i][j]
			if a.Kind != "gpu" || b.Kind != "gpu" || (c.Kind != snapshot.LinkNVLink && c.Kind != snapshot.LinkXGMI) {
				continue
			}
			l := uiLink{A: a.PCI, B: b.PCI, Kind: c.Kind, Count: c.Links, GBps: c.GBpsUni, PerDir: true,
				ViaSwitch: c.Kind == snapshot.LinkNVLink && viaSwitch[a.PCI] && viaSwitch[b.PCI]}
			name := map[string]string{snapshot.LinkNVLink: "NVLink", snapshot.LinkXGMI: "xGMI"}[c.Kind]
			if c.Links > 0 {
				name = fmt.Sprintf("%d× %s", c.Links, name)
			}
			if l.ViaSwitch {
				name += " via NVSwitch"
			}
			switch {
			case c.GBpsUni > 0 && c.GBpsBidi > 0:
				name += fmt.Sprintf(", %g GB/s per direction (%g both ways)", c.GBpsUni, c.GBpsBidi)
			case c.GBpsUni > 0:
				name += fmt.Sprintf(", %g GB/s per direction", c.GBpsUni)
			default:
				name += ", bandwidth unknown"
			}
			l.Label = name
			out = append(out, l)
		}
	}
	return out
}

// uiEvents is a stream of server-sent events: "change" whenever the
// server's state changes or agents send new readings (at most twice a
// second), a comment every 15 s to keep the connection.
func (s *Server) uiEvents(w http.ResponseWriter, r *http.Request, c *caller) {
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{})
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	_, _ = fmt.Fprint(w, "retry: 2000\n\n")
	if rc.Flush() != nil {
		return
	}
	keep := time.NewTicker(15 * time.Second)
	defer keep.Stop()
	for {
		s.mu.Lock()
		ch := s.changed
		s.mu.Unlock()
		readings := s.history.changed()
		select {
		case <-r.Context().Done():
			return
		case <-readings:
		case <-keep.C:
			if _, err := fmt.Fprint(w, ": keep\n\n"); err != nil || rc.Flush() != nil {
				return
			}
			continue
		case <-ch:
		}
		if _, err := fmt.Fprint(w, "event: change\ndata: {}\n\n"); err != nil || rc.Flush() != nil {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// uiGPU is a GPU's hour of readings.
func (s *Server) uiGPU(w http.ResponseWriter, r *http.Request, c *caller) {
	id := r.PathValue("id")
	idx, err := strconv.Atoi(r.PathValue("index"))
	if err != nil || idx < 0 || idx >= maxNodeGPUs {
		writeErr(w, http.StatusBadRequest, errors.New("a GPU index, 0 to 255"))
		return
	}
	s.mu.Lock()
	n, ok := s.core.NodeInfo(id)
	s.mu.Unlock()
	if !ok {
		writeErr(w, http.StatusNotFound, fmt.Errorf("node %s not found", id))
		return
	}
	type sample struct {
		At    int64    `json:"t"`
		Util  *float64 `json:"util,omitempty"`
		Mem   *uint64  `json:"mem,omitempty"`
		Power *float64 `json:"power,omitempty"`
		Temp  *float64 `json:"temp,omitempty"`
	}
	out := struct {
		Node   string     `json:"node"`
		GPU    api.Device `json:"gpu"`
		StepS  int        `json:"step_s"`
		Points []sample   `json:"points"`
	}{Node: id, StepS: int(historyStep / time.Second), Points: []sample{}}
	found := false
	for _, d := range n.Devices {
		if d.Index == idx && d.Parent == "" {
			out.GPU, found = d, true
		}
	}
	if !found {
		writeErr(w, http.StatusNotFound, fmt.Errorf("node %s has no GPU %d", id, idx))
		return
	}
	f := func(ok bool, v float32) *float64 {
		if !ok {
			return nil
		}
		x := float64(v)
		return &x
	}
	for _, p := range s.history.series(id, idx) {
		x := sample{At: p.at, Util: f(p.hasUtil, p.util), Power: f(p.hasPower, p.power), Temp: f(p.hasTp, p.temp)}
		if p.hasMem {
			m := p.mem
			x.Mem = &m
		}
		out.Points = append(out.Points, x)
	}
	writeJSON(w, http.StatusOK, out)
}

// uiLease is a lease with its jobs, as the caller may see them.
func (s *Server) uiLease(w http.ResponseWriter, r *http.Request, c *caller) {
	r = r.WithContext(withCaller(r, c))
	id := r.PathValue("id")
	s.mu.Lock()
	l, _, err := s.leaseByID(r, id)
	if err != nil {
		s.mu.Unlock()
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	s.core.Decorate(l, time.Now())
	out := struct {
		Lease *api.Lease `json:"lease"`
		Jobs  []*api.Job `json:"jobs"`
	}{Lease: l, Jobs: []*api.Job{}}
	for _, jid := range l.Jobs {
		if j, err := s.jobByID(r, jid); err == nil {
			out.Jobs = append(out.Jobs, j)
		}
	}
	seq := s.wseq
	s.mu.Unlock()
	if err := s.durable(seq); err != nil {
		writeErr(w, http.StatusServiceUnavailable, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// imageFleetMemo keeps the fleet's image findings for a while: judging
// every image on every GPU of the fleet for each view (twice a second per
// open page) would cost a large fleet seconds of CPU. They are made again
// when the images or the set of nodes change, and at least every
// imageFleetTTL, so a node's new driver shows within that.
type imageFleetMemo struct {
	mu    sync.Mutex
	at    time.Time
	key   string
	found []doctor.Finding
}

const imageFleetTTL = 30 * time.Second

func (m *imageFleetMemo) findings(imgs []compat.Checked, snaps map[string]*snapshot.Snapshot, k *kb.KB, now time.Time) []doctor.Finding {
	var b strings.Builder
	for _, im := range imgs {
		fmt.Fprintf(&b, "%s\x00%s\x00%p\x01", im.Ref, im.Platform, im.Requirements)
	}
	names := make([]string, 0, len(snaps))
	for n, sn := range snaps {
		if sn != nil {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	b.WriteString(strings.Join(names, "\x00"))
	key := b.String()
	m.mu.Lock()
	defer m.mu.Unlock()
	if key == m.key && now.Sub(m.at) < imageFleetTTL && now.Sub(m.at) >= 0 {
		return m.found
	}
	m.found, m.key, m.at = compat.Fleet(imgs, snaps, k), key, now
	return m.found
}
