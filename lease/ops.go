package lease

import (
	"sort"
	"time"

	"kiln.dev/kiln/api"
)

// Nodes is every node as the API shows it, in id order.
func (s *Core) Nodes() []api.Node {
	out := []api.Node{}
	for _, n := range s.nodeList() {
		out = append(out, s.nodeAPI(n))
	}
	return out
}

// NodeInfo is a node as the API shows it.
func (s *Core) NodeInfo(id string) (api.Node, bool) {
	n := s.nodes[id]
	if n == nil {
		return api.Node{}, false
	}
	return s.nodeAPI(n), true
}

// Drain drains (or undrains) devices of a node, all of them when none is
// named, or frees what lost leases hold there (clearLost); by is who asks.
func (s *Core) Drain(now time.Time, id string, devices []string, undrain, clearLost bool, reason, by string) (api.Node, *Changes, error) {
	n := s.nodes[id]
	if n == nil {
		return api.Node{}, nil, Errorf(NotFound, "node %s not found", id)
	}
	var units []*unitState
	if len(devices) == 0 {
		units = n.units
	} else {
		for _, d := range devices {
			u := n.byID[d]
			if u == nil {
				return api.Node{}, nil, Errorf(NotFound, "node %s has no device %s", id, d)
			}
			units = append(units, u)
		}
	}
	b := newChanges(now)
	if clearLost {
		s.clearLost(n, "cleared by "+by, b)
		b.Event("node.cleared", id, "", "%s cleared the devices lost leases held on %s", by, id)
	} else {
		if reason == "" {
			reason = "drained by " + by
		}
		for _, u := range units {
			if undrain {
				u.dev.Drained, u.dev.DrainReason = false, ""
			} else {
				u.dev.Drained, u.dev.DrainReason = true, reason
			}
			b.Drains = append(b.Drains, Drain{id, u.dev.ID, DeviceState{Drained: u.dev.Drained, Reason: u.dev.DrainReason}})
		}
		s.redraw(n)
		verb := "drained"
		if undrain {
			verb = "undrained"
		}
		b.Event("node."+verb, id, "", "%s %s %d devices: %s", by, verb, len(units), reason)
	}
	s.schedule(now, b)
	return s.nodeAPI(n), b, nil
}

// Projects are the projects visible says the caller may see, in name
// order, with what each holds, used in its period and has queued (members
// are not the core's: the caller adds them).
func (s *Core) Projects(now time.Time, visible func(project string) bool) []api.Project {
	queued := map[string]int{}
	for _, ls := range s.queued {
		queued[ls.l.Project]++
	}
	var names []string
	for name := range s.projects {
		if visible(name) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	out := []api.Project{}
	for _, name := range names {
		ps := s.projects[name]
		p := ps.p
		p.HeldGPUs = ps.held
		p.UsedHours = s.usedHours(ps, now)
		p.QueuedLease = queued[name]
		out = append(out, p)
	}
	return out
}

// HasProject reports whether the project exists.
func (s *Core) HasProject(name string) bool { return s.projects[name] != nil }

// PutProject sets a project's weight, quotas and limits (its members are
// the caller's) and runs the queue under them.
func (s *Core) PutProject(now time.Time, p api.Project) *Changes {
	ps := s.project(p.Name, now)
	p.Members = nil
	ps.p = p
	b := newChanges(now)
	s.schedule(now, b)
	return b
}

// AddProject adds a project that is kept already (the server's first
// start).
func (s *Core) AddProject(now time.Time, p api.Project) {
	s.projects[p.Name] = &projState{p: p, recentAt: now, period: periodStart(now, p.PeriodSeconds)}
}
