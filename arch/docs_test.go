package arch

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// planned are packages the table may describe before they exist; a row for
// any other package that does not exist fails. Take a name out once its
// package is in the module.
var planned = []string{}

// docTable is where the package table lives and the heading above it.
const (
	docFile    = "docs/architecture.md"
	docHeading = "## Packages"
)

// tableRows reads the package names of the table under heading in the
// Markdown text: the first cell of each row, one package in backquotes.
func tableRows(text, heading string) ([]string, error) {
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	in, header := false, 0
	var rows []string
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case !in:
			in = strings.HasPrefix(line, heading)
		case strings.HasPrefix(line, "|"):
			if header < 2 { // the header and the |---| line
				header++
				continue
			}
			cell, _, _ := strings.Cut(strings.TrimPrefix(line, "|"), "|")
			cell = strings.TrimSpace(cell)
			name, opened := strings.CutPrefix(cell, "`")
			name, closed := strings.CutSuffix(name, "`")
			if !opened || !closed || name == "" || strings.ContainsAny(name, "` ") {
				return nil, fmt.Errorf("line %d: the first cell %q is not one package in backquotes", n, cell)
			}
			rows = append(rows, name)
		case len(rows) > 0 || strings.HasPrefix(line, "#"):
			if len(rows) == 0 {
				return nil, fmt.Errorf("no table under %q", heading)
			}
			return rows, nil
		}
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("no table under %q", heading)
	}
	return rows, sc.Err()
}

// checkTable says what is wrong with rows as the module's package table:
// a package missing, a row twice, a row for no package (unless planned),
// and a package that imports one listed above it.
func checkTable(rows []string, g graph, planned []string) []string {
	var problems []string
	at := map[string]int{}
	for i, p := range rows {
		if _, dup := at[p]; dup {
			problems = append(problems, fmt.Sprintf("%s has two rows", p))
			continue
		}
		at[p] = i
	}
	for _, p := range keys(g) {
		if _, ok := at[p]; !ok {
			problems = append(problems, fmt.Sprintf("package %s is missing from the table", p))
		}
	}
	for i, p := range rows {
		if at[p] != i {
			continue // a second row, already reported
		}
		imports, exists := g[p]
		if !exists {
			if !slices.Contains(planned, p) {
				problems = append(problems, fmt.Sprintf("row %s names no package of the module", p))
			}
			continue
		}
		for _, imp := range imports {
			if j, listed := at[imp]; listed && j < i {
				problems = append(problems, fmt.Sprintf("%s imports %s, which is listed above it (dependencies must point down the list)", p, imp))
			}
		}
	}
	return problems
}

// TestArchitectureTable checks the package table of docs/architecture.md
// against the module: every package listed once, no row for a package that
// does not exist, and the order true: each package imports only packages
// listed below it.
func TestArchitectureTable(t *testing.T) {
	m := realModule(t)
	text, err := os.ReadFile(filepath.Join(m.dir, docFile))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := tableRows(string(text), docHeading)
	if err != nil {
		t.Fatalf("%s: %v", docFile, err)
	}
	for _, p := range checkTable(rows, m.graph, planned) {
		t.Errorf("%s: %s", docFile, p)
	}
	for _, p := range planned {
		if _, ok := m.graph[p]; ok {
			t.Logf("planned package %s exists now: it can leave the planned list", p)
		}
	}
}

func TestCheckTable(t *testing.T) {
	doc := "# x\n\n" + docHeading + " (dependencies point down this list)\n\n" +
		"| package | what | I/O |\n|---|---|---|\n" +
		"| `cmd/kiln` | commands | yes |\n" +
		"| `topo` | matrix | no |\n" +
		"| `snapshot` | model | no |\n" +
		"| `lease` | core | no |\n" +
		"\nAfter the table.\n\n## Next\n| `not` | a row | no |\n"
	rows, err := tableRows(doc, docHeading)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"cmd/kiln", "topo", "snapshot", "lease"}; !slices.Equal(rows, want) {
		t.Fatalf("rows %v, want %v", rows, want)
	}
	g := graph{"cmd/kiln": {"fmt", "snapshot", "topo"}, "topo": {"snapshot"}, "snapshot": nil}
	if p := checkTable(rows, g, []string{"lease"}); len(p) != 0 {
		t.Errorf("a true table: %v", p)
	}
	// Each broken in one way.
	for _, c := range []struct {
		rows    []string
		g       graph
		planned []string
		want    string
	}{
		{rows, graph{"cmd/kiln": {"topo"}, "topo": {"snapshot"}, "snapshot": nil, "kb": nil}, []string{"lease"}, "package kb is missing from the table"},
		{rows, g, nil, "row lease names no package of the module"},
		{rows, graph{"cmd/kiln": {"topo"}, "topo": {"snapshot"}, "snapshot": {"topo"}}, []string{"lease"}, "snapshot imports topo, which is listed above it (dependencies must point down the list)"},
		{append(slices.Clone(rows), "topo"), g, []string{"lease"}, "topo has two rows"},
	} {
		if p := checkTable(c.rows, c.g, c.planned); !slices.Equal(p, []string{c.want}) {
			t.Errorf("got %q, want [%q]", p, c.want)
		}
	}
	if _, err := tableRows("| `x` | no heading |\n", docHeading); err == nil {
		t.Error("a text without the heading gave rows")
	}
	if _, err := tableRows(docHeading+"\n| a | b |\n|---|---|\n| kiln and more | x |\n", docHeading); err == nil {
		t.Error("a row whose first cell is no package was accepted")
	}
}
