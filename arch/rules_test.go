package arch

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// A rule forbids the packages it binds to import some others. Patterns name
// a package relative to the module ("doctor") or by its full path outside
// it ("os/exec"); "x/..." is x and every package below it, "..." is every
// package.
type rule struct {
	pkgs   []string // the packages the rule binds
	except []string // of those, the ones it does not
	forbid []string // what they may not import
	deps   bool     // not even through other packages of the module
	reason string
}

// analysis are kiln's analysis packages: pure functions of a Snapshot, the
// knowledge base and bytes that others read. A new one is a line here.
var analysis = []string{
	"snapshot", "kb", "topo", "doctor", "plan",
	// not compat/image, which reads images, nor compat/pkgdb, which opens
	// rpm's SQLite database (a temporary copy) to read its packages
	"compat", "compat/fatbin", "compat/offload", "compat/elfsect",
	"sched", "sched/shapes", "sched/frag",
	"unwrap", "kmsg", "textsafe", "units", "version",
	"gpubench",  // not its drivers (cudadrv, hip, nccl, hostmem), which load libraries and place memory
	"dra",       // not dra/plugin or dra/kubetest, which talk to a cluster
	"admission", // not admission/webhook, which reads registries and the cluster
	"lease", "placement", "demo",
	"serving",    // kiln serve's choice of engine, image, node and GPUs
	"gpumetrics", // not gpumetrics/prom, whose client library speaks HTTP
}

// edges are the packages that reach machines, files, the network and the
// database, and the commands above them.
var edges = []string{"discover/...", "capture/...", "server/...", "store/...", "agent/...", "executor/...", "cmd/..."}

// rules is kiln's layering. A new rule is a line here.
var rules = []rule{
	{pkgs: analysis, forbid: []string{"os/exec", "net/http/...", "database/sql/..."},
		reason: "analysis packages are pure functions of what they are given: they start no program, speak no HTTP and open no database, so each is tested on recorded machines and never reaches out"},
	{pkgs: analysis, forbid: edges, deps: true,
		reason: "analysis packages sit below the edges that read machines, files, the network and the database, and below the commands: they may not reach them, not even through another package"},
	{pkgs: []string{"..."}, except: []string{"server", "cmd/kiln"}, forbid: []string{"store/..."},
		reason: "the database is the server's: only the server (and kiln's command, which wires it) may import the store; agents, the CLI and the lease core go through the server's API or return changes for the server to write"},
}

func match(pattern, pkg string) bool {
	if pattern == "..." {
		return true
	}
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == base || strings.HasPrefix(pkg, base+"/")
	}
	return pkg == pattern
}

func matchAny(patterns []string, pkg string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return match(p, pkg) })
}

func (r *rule) binds(pkg string) bool {
	return matchAny(r.pkgs, pkg) && !matchAny(r.except, pkg)
}

// A violation is a forbidden import: pkg imports imp, directly (via is
// pkg, imp) or through the packages of via.
type violation struct {
	via    []string
	reason string
}

func (v violation) String() string {
	pkg, imp := v.via[0], v.via[len(v.via)-1]
	if len(v.via) == 2 {
		return fmt.Sprintf("%s imports %s: %s", pkg, imp, v.reason)
	}
	return fmt.Sprintf("%s imports %s through %s: %s", pkg, imp, strings.Join(v.via[1:len(v.via)-1], " -> "), v.reason)
}

// check lists every forbidden import of g under rules, in the order of the
// rules and then of the packages.
func check(g graph, rules []rule) []violation {
	pkgs := make([]string, 0, len(g))
	for p := range g {
		pkgs = append(pkgs, p)
	}
	slices.Sort(pkgs)
	var out []violation
	for _, r := range rules {
		for _, p := range pkgs {
			if !r.binds(p) {
				continue
			}
			for _, via := range reach(g, p, r.deps) {
				if matchAny(r.forbid, via[len(via)-1]) {
					out = append(out, violation{via: via, reason: r.reason})
				}
			}
		}
	}
	return out
}

// reach lists what pkg imports, each as the path from pkg to it: its own
// imports, and with deps also what those import, through the module's
// packages (a package outside the module is not followed), breadth first,
// so each path is a shortest one.
func reach(g graph, pkg string, deps bool) [][]string {
	var out [][]string
	seen := map[string]bool{pkg: true}
	queue := [][]string{{pkg}}
	for len(queue) > 0 {
		path := queue[0]
		queue = queue[1:]
		for _, imp := range g[path[len(path)-1]] {
			if seen[imp] {
				continue
			}
			seen[imp] = true
			next := append(slices.Clip(path), imp)
			out = append(out, next)
			if _, inModule := g[imp]; deps && inModule {
				queue = append(queue, next)
			}
		}
	}
	return out
}

// TestLayering checks the module's real import graph against the rules.
func TestLayering(t *testing.T) {
	m := realModule(t)
	for _, v := range check(m.graph, rules) {
		t.Error(v)
	}
	// A rule that binds nothing has a typo in it.
	for _, r := range rules {
		for _, p := range r.pkgs {
			if !slices.ContainsFunc(keys(m.graph), func(pkg string) bool { return match(p, pkg) }) && !slices.Contains(planned, p) {
				t.Errorf("rule %q names %q, which is no package of the module", r.reason, p)
			}
		}
	}
}

func keys(g graph) []string {
	out := make([]string, 0, len(g))
	for k := range g {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestCheckReportsExactlyTheForbidden feeds the checker a made-up graph.
func TestCheckReportsExactlyTheForbidden(t *testing.T) {
	g := graph{
		"doctor":   {"fmt", "os/exec", "snapshot"}, // forbidden: an analysis package runs programs
		"topo":     {"snapshot", "source"},         // forbidden: reaches discover through source
		"source":   {"discover", "snapshot"},       // allowed: source is no analysis package
		"discover": {"os/exec", "snapshot"},        // allowed: discover is an edge
		"server":   {"net/http", "store"},          // allowed: the store is the server's
		"agent":    {"net/http", "store"},          // forbidden: only the server may import the store
		"store":    {"database/sql", "snapshot"},
		"snapshot": {"encoding/json"},
	}
	got := check(g, rules)
	want := []string{
		"doctor imports os/exec: " + rules[0].reason,
		"topo imports discover through source: " + rules[1].reason,
		"agent imports store: " + rules[2].reason,
	}
	var gotText []string
	for _, v := range got {
		gotText = append(gotText, v.String())
	}
	if !slices.Equal(gotText, want) {
		t.Errorf("check reported\n\t%s\nwant\n\t%s", strings.Join(gotText, "\n\t"), strings.Join(want, "\n\t"))
	}

	// The same graph without the forbidden edges passes.
	g["doctor"] = []string{"fmt", "snapshot"}
	g["topo"] = []string{"snapshot"}
	g["agent"] = []string{"net/http"}
	if got := check(g, rules); len(got) != 0 {
		t.Errorf("check reported %v on a graph that keeps every rule", got)
	}
}

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, pkg string
		want         bool
	}{
		{"...", "cmd/kiln", true},
		{"cmd/...", "cmd", true},
		{"cmd/...", "cmd/kiln-dra", true},
		{"cmd/...", "cmdx", false},
		{"compat", "compat/image", false},
		{"net/http/...", "net/http/httptest", true},
		{"os/exec", "os", false},
	} {
		if got := match(c.pattern, c.pkg); got != c.want {
			t.Errorf("match(%q, %q) = %v, want %v", c.pattern, c.pkg, got, c.want)
		}
	}
}
