package capture

import (
	"fmt"
	"sort"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// Machine is the inputs that describe one machine, merged.
type Machine struct {
	// Label names the machine in reports: its host name, or "machine 2".
	Label    string
	Parts    []Part
	Snapshot *snapshot.Snapshot
	// Why says what tied its inputs together, or why it stands apart.
	Why string
}

// Machines groups inputs into the machines they describe, so that captures
// of two machines are never merged silently. Inputs are of one machine when
// they come from one bundle, or share a host name, a GPU UUID or serial, or
// a GPU's PCI address (unless their host names differ). Inputs that name no
// machine at all (a topology matrix, a log without a GPU line) join the
// machine when there is one; with several, they are a machine of their own.
// Failed parts are left out.
func Machines(parts []Part) []Machine {
	var ok []Part
	for _, p := range parts {
		if p.Err == nil && p.Snapshot != nil {
			ok = append(ok, p)
		}
	}
	if len(ok) == 0 {
		return nil
	}
	ids := make([]identity, len(ok))
	for i, p := range ok {
		ids[i] = identify(p.Snapshot)
	}
	parent := make([]int, len(ok))
	for i := range parent {
		parent[i] = i
	}
	var find func(int) int
	find = func(i int) int {
		if parent[i] != i {
			parent[i] = find(parent[i])
		}
		return parent[i]
	}
	for i := range ok {
		for j := i + 1; j < len(ok); j++ {
			if (ok[i].Bundle != "" && ok[i].Bundle == ok[j].Bundle) || ids[i].sameMachine(ids[j]) {
				parent[find(j)] = find(i)
			}
		}
	}
	groups := map[int][]int{}
	var order []int
	var anonymous []int
	for i := range ok {
		if ids[i].empty() && ok[i].Bundle == "" {
			anonymous = append(anonymous, i)
			continue
		}
		r := find(i)
		if _, seen := groups[r]; !seen {
			order = append(order, r)
		}
		groups[r] = append(groups[r], i)
	}
	// Bundle members without identity were linked by their bundle; a
	// group made only of parts without identity is anonymous too.
	switch {
	case len(order) == 0:
		order = []int{anonymous[0]}
		groups[anonymous[0]] = anonymous
	case len(order) == 1:
		groups[order[0]] = append(groups[order[0]], anonymous...)
		sort.Ints(groups[order[0]])
	case len(anonymous) > 0:
		order = append(order, -1)
		groups[-1] = anonymous
	}
	out := make([]Machine, 0, len(order))
	for n, r := range order {
		var m Machine
		var snaps []*snapshot.Snapshot
		for _, i := range groups[r] {
			m.Parts = append(m.Parts, ok[i])
			snaps = append(snaps, ok[i].Snapshot)
		}
		if len(snaps) == 1 {
			m.Snapshot = snaps[0]
		} else {
			m.Snapshot = snapshot.Merge(snaps...)
		}
		switch {
		case r == -1:
			m.Label = "inputs that name no machine"
			m.Why = "these inputs name no host, GPU address or UUID, and the other inputs are of several machines"
		case m.Snapshot.Host.Hostname != "":
			m.Label = m.Snapshot.Host.Hostname
		default:
			m.Label = fmt.Sprintf("machine %d", n+1)
		}
		out = append(out, m)
	}
	if len(out) > 1 {
		for i := range out {
			if out[i].Why == "" {
				out[i].Why = "shares no host name, GPU UUID or PCI address with the other inputs"
			}
		}
	}
	return out
}

// identity is what an input says about which machine it is of.
type identity struct {
	host  string
	uuids map[string]bool
	addrs map[string]bool
}

func identify(s *snapshot.Snapshot) identity {
	id := identity{host: strings.ToLower(strings.TrimSpace(s.Host.Hostname)), uuids: map[string]bool{}, addrs: map[string]bool{}}
	for _, g := range s.GPUs {
		if g.UUID != "" {
			id.uuids[strings.ToLower(g.UUID)] = true
		}
		if g.Serial != "" && !placeholderSerial(g.Serial) {
			id.uuids["serial:"+g.Serial] = true
		}
		if g.PCIAddress != "" {
			id.addrs[g.PCIAddress] = true
		}
	}
	for _, e := range s.Events {
		if e.Device == "" {
			continue
		}
		switch e.Kind {
		case snapshot.EventXid, snapshot.EventFallenOffBus, snapshot.EventAMDGPU, snapshot.EventToolError:
			id.addrs[e.Device] = true
		}
	}
	return id
}

func placeholderSerial(s string) bool {
	l := strings.ToLower(s)
	return l == "n/a" || l == "0" || strings.Trim(l, "0") == "" || strings.HasPrefix(l, "[n/a")
}

func (a identity) empty() bool { return a.host == "" && len(a.uuids) == 0 && len(a.addrs) == 0 }

func (a identity) sameMachine(b identity) bool {
	if a.host != "" && b.host != "" {
		if a.host == b.host {
			return true
		}
		// Two names: two machines, unless a GPU itself moved with its UUID.
		return overlap(a.uuids, b.uuids)
	}
	return overlap(a.uuids, b.uuids) || overlap(a.addrs, b.addrs)
}

func overlap(a, b map[string]bool) bool {
	if len(a) > len(b) {
		a, b = b, a
	}
	for k := range a {
		if b[k] {
			return true
		}
	}
	return false
}
