package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// recorder stands in for a test: it keeps what Need says and stops Need
// where a real test would stop.
type recorder struct {
	testing.TB
	skipped, failed string
}

type stopped struct{}

func (r *recorder) Helper() {}
func (r *recorder) Skipf(format string, args ...any) {
	r.skipped = fmt.Sprintf(format, args...)
	panic(stopped{})
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	panic(stopped{})
}

func need(program, hint string) (path string, r *recorder) {
	r = &recorder{}
	defer func() {
		if v := recover(); v != nil {
			if _, ok := v.(stopped); !ok {
				panic(v)
			}
		}
	}()
	return Need(r, program, hint), r
}

// tools makes a directory with an executable tool and a file that is not
// executable, and makes it the whole PATH, with no sbin directories.
func tools(t *testing.T) string {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "kiln-tool"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kiln-data"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	old := SbinDirs
	SbinDirs = nil
	t.Cleanup(func() { SbinDirs = old })
	return dir
}

func TestNeedFindsOnPath(t *testing.T) {
	dir := tools(t)
	t.Setenv(RequireEnv, "1")
	p, r := need("kiln-tool", "apt-get install kiln-tool")
	if p != filepath.Join(dir, "kiln-tool") || r.skipped != "" || r.failed != "" {
		t.Errorf("Need = %q, skipped %q, failed %q", p, r.skipped, r.failed)
	}
	abs := filepath.Join(dir, "kiln-tool")
	if p, _ := need(abs, ""); p != abs {
		t.Errorf("Need(%q) = %q", abs, p)
	}
}

func TestNeedFindsInSbin(t *testing.T) {
	dir := tools(t)
	t.Setenv("PATH", t.TempDir())
	SbinDirs = []string{t.TempDir(), dir}
	if p, r := need("kiln-tool", "hint"); p != filepath.Join(dir, "kiln-tool") {
		t.Errorf("Need = %q, skipped %q, failed %q", p, r.skipped, r.failed)
	}
}

func TestNeedSkipsWithHint(t *testing.T) {
	tools(t)
	t.Setenv(RequireEnv, "")
	for _, prog := range []string{"kiln-missing", "kiln-data"} {
		p, r := need(prog, "apt-get install kiln-missing")
		if p != "" || r.failed != "" || !strings.Contains(r.skipped, "apt-get install kiln-missing") || !strings.Contains(r.skipped, prog) {
			t.Errorf("%s: Need = %q, skipped %q, failed %q; want a skip with the hint", prog, p, r.skipped, r.failed)
		}
	}
}

func TestNeedFailsWhenRequired(t *testing.T) {
	tools(t)
	t.Setenv(RequireEnv, "1")
	p, r := need("kiln-missing", "apt-get install kiln-missing")
	if p != "" || r.skipped != "" || !strings.Contains(r.failed, "kiln-missing is required") || !strings.Contains(r.failed, "apt-get install kiln-missing") {
		t.Errorf("%s=1: Need = %q, skipped %q, failed %q; want a failure", RequireEnv, p, r.skipped, r.failed)
	}
	// Anything but 1 keeps the skip.
	t.Setenv(RequireEnv, "0")
	if _, r := need("kiln-missing", "hint"); r.skipped == "" || r.failed != "" {
		t.Errorf("%s=0: skipped %q, failed %q; want a skip", RequireEnv, r.skipped, r.failed)
	}
}
