package lease

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"kiln.dev/kiln/placement"
)

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

// sandboxNodes are the nodes whose sandbox gives everything required, and
// why the others do not, each reason once (whyNot).
func (s *Core) sandboxNodes(require []string) ([]string, string) {
	out := []string{}
	why := map[string]string{}
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
			continue
		}
		detail := "it reports no sandbox"
		if sb != nil {
			detail = strings.Join(sb.Missing, "; ")
		}
		why[n.rec.Node.ID] = fmt.Sprintf("lacks %s (%s)", strings.Join(lack, ", "), detail)
	}
	return out, whyNot(why, len(out) == 0, "every node ")
}

// containerNodes are the nodes that run jobs with an image, and why the
// others do not, each reason once (whyNot).
func (s *Core) containerNodes() ([]string, string) {
	out := []string{}
	why := map[string]string{}
	for _, n := range s.nodeList() {
		if n.rec.Node.Containers != "" {
			out = append(out, n.rec.Node.ID)
			continue
		}
		r := n.rec.Node.NoContainers
		if r == "" {
			r = "its agent has not said it runs containers"
		}
		why[n.rec.Node.ID] = r
	}
	return out, whyNot(why, len(out) == 0, "")
}

// whyNot words why nodes cannot do something: a reason every node has is
// said once, without names, when none can ("no containerd socket at
// /run/containerd/containerd.sock"); otherwise the nodes are named before
// their reason ("hgx-1, hgx-2: ...; mi300: ..."), the five largest groups,
// each with at most five names. all is put before a reason said once.
func whyNot(why map[string]string, none bool, all string) string {
	nodes := map[string][]string{}
	for n, r := range why {
		nodes[r] = append(nodes[r], n)
	}
	if len(nodes) == 1 && none {
		for r := range nodes {
			return all + r
		}
	}
	reasons := make([]string, 0, len(nodes))
	for r, ns := range nodes {
		sort.Strings(ns)
		reasons = append(reasons, r)
	}
	sort.Slice(reasons, func(i, j int) bool {
		a, b := nodes[reasons[i]], nodes[reasons[j]]
		if len(a) != len(b) {
			return len(a) > len(b)
		}
		return a[0] < b[0]
	})
	var parts []string
	for i, r := range reasons {
		if i == 5 {
			parts = append(parts, fmt.Sprintf("%d more reasons", len(reasons)-5))
			break
		}
		ns := nodes[r]
		names := strings.Join(ns[:min(len(ns), 5)], ", ")
		if len(ns) > 5 {
			names += fmt.Sprintf(" and %d more", len(ns)-5)
		}
		parts = append(parts, names+": "+r)
	}
	return strings.Join(parts, "; ")
}

// refusal says why a lease cannot be granted as asked whatever the
// devices hold (quotas, images), and the kind of it; "" when it can.
// noContainers says why nodes cannot run the lease's image, if it has one.
func (s *Core) refusal(ls *leaseState, allowed []string, noContainers string, now time.Time) (string, RefusalKind) {
	ps := s.project(ls.l.Project, now)
	if ps.p.MaxGPUs > 0 && ls.need > ps.p.MaxGPUs+1e-9 {
		return fmt.Sprintf("asks for %g GPUs; project %s may hold at most %g at once", ls.need, ps.p.Name, ps.p.MaxGPUs), RefusedMaxGPUs
	}
	if ps.p.GPUHours > 0 {
		if used := s.usedHours(ps, now); used >= ps.p.GPUHours {
			return fmt.Sprintf("project %s used %.1f of its %g GPU-hours in this period", ps.p.Name, used, ps.p.GPUHours), RefusedGPUHours
		}
	}
	if allowed != nil && len(ls.req.Constraints.Nodes) == 0 && ls.l.Request.Job != nil && ls.l.Request.Job.Image != "" {
		if len(allowed) == 0 && noContainers != "" {
			return fmt.Sprintf("image %s: no node runs containers: %s", ls.l.Request.Job.Image, noContainers), RefusedImage
		}
		return fmt.Sprintf("image %s runs on no node it may use (kiln compat, container executors, the nodes asked for)", ls.l.Request.Job.Image), RefusedImage
	}
	return "", ""
}

// refuseIfNeverFits refuses a new lease that could not fit even if every
// device were free; it asks once per lease, the first time the lease
// cannot be placed at once, and says whether it refused.
func (s *Core) refuseIfNeverFits(ls *leaseState, now time.Time, b *Changes) bool {
	if !ls.checkFit {
		return false
	}
	ls.checkFit = false
	if reason := s.neverFits(ls); reason != "" {
		s.refuse(ls, RefusedNeverFits, reason, now, b)
		return true
	}
	return false
}

// neverFits says why the lease could not fit even on an idle cluster, or "".
func (s *Core) neverFits(ls *leaseState) string {
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
