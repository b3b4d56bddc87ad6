package lease

import (
	"kiln.dev/kiln/api"
)

// clearLost frees what lost leases hold on a node, their tasks there
// marked lost with reason; s.mu is held.
func (s *Core) clearLost(n *Node, reason string, b *Changes) {
	id := n.rec.Node.ID
	for _, ls := range s.holding {
		if ls.heldNodes[id] {
			for _, js := range ls.jobs {
				if t := js.task(id); t != nil && !api.JobFinal(t.State) {
					t.State, t.Reason = api.JobLost, reason
					b.job(js.j)
				}
				delete(n.stops, js.j.ID)
				delete(n.tasks, js.j.ID)
			}
			s.releaseHold(ls, id, b)
		}
	}
}
