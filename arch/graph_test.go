package arch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
)

// graph is an import graph: each package of the module, named relative to
// the module ("cmd/kiln"), with the packages its non-test files import
// (module packages relative too, others by their full path). Only module
// packages are keys.
type graph map[string][]string

// configs are the build configurations whose files count: a file that only
// builds without cgo, or only off Linux, imports as much as any other.
var configs = [][]string{
	{"CGO_ENABLED=1"},
	{"CGO_ENABLED=0"},
	{"CGO_ENABLED=0", "GOOS=darwin"},
}

type module struct {
	path, dir string
	graph     graph
}

var loadModule = sync.OnceValues(func() (*module, error) {
	out, err := goCmd("", nil, "list", "-m", "-f", "{{.Path}}\t{{.Dir}}")
	if err != nil {
		return nil, err
	}
	path, dir, ok := strings.Cut(strings.TrimSpace(string(out)), "\t")
	if !ok || path == "" || dir == "" {
		return nil, fmt.Errorf("go list -m printed %q, not the module's path and directory", out)
	}
	m := &module{path: path, dir: dir, graph: graph{}}
	for _, env := range configs {
		if err := m.add(env); err != nil {
			return nil, err
		}
	}
	return m, nil
})

// add merges the graph go list reports under env.
func (m *module) add(env []string) error {
	out, err := goCmd(m.dir, env, "list", "-e", "-json=ImportPath,Imports,Error", "./...")
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath string
			Imports    []string
			Error      *struct{ Err string }
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("reading go list's output (%s): %w", strings.Join(env, " "), err)
		}
		if p.Error != nil {
			return fmt.Errorf("go list (%s): %s: %s", strings.Join(env, " "), p.ImportPath, p.Error.Err)
		}
		name := m.rel(p.ImportPath)
		seen := map[string]bool{}
		for _, i := range m.graph[name] {
			seen[i] = true
		}
		imports := m.graph[name]
		for _, i := range p.Imports {
			if i = m.rel(i); !seen[i] {
				seen[i] = true
				imports = append(imports, i)
			}
		}
		sort.Strings(imports)
		m.graph[name] = imports
	}
	return nil
}

// rel names a package of the module relative to it; others keep their path.
func (m *module) rel(path string) string {
	if path == m.path {
		return "."
	}
	if r, ok := strings.CutPrefix(path, m.path+"/"); ok {
		return r
	}
	return path
}

func goCmd(dir string, env []string, args ...string) ([]byte, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("the go command is not on PATH (go test puts it there): %w", err)
	}
	cmd := exec.Command(goBin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s (%s): %w\n%s", strings.Join(args, " "), strings.Join(env, " "), err, stderr.Bytes())
	}
	return out, nil
}

// realModule is the module as go list sees it now, or fails t.
func realModule(t *testing.T) *module {
	t.Helper()
	m, err := loadModule()
	if err != nil {
		t.Fatal(err)
	}
	return m
}
