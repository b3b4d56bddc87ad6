// Package testenv is kiln's one policy for tests that need a program from
// outside the module (docker-registry, containerd, runc, gcc, LLVM's tools):
// in a plain `go test ./...` such a test skips and says how to install the
// program; where KILN_REQUIRE_TOOLS=1 is set (scripts/test.sh and CI set it)
// it fails instead, so that a missing package can never pass as a skip.
package testenv

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// RequireEnv is the environment variable that turns a missing program
// from a skip into a failure when it is "1".
const RequireEnv = "KILN_REQUIRE_TOOLS"

// SbinDirs are searched after PATH: Debian installs runc and other daemons'
// helpers in /usr/sbin, which a non-login shell's PATH may lack.
var SbinDirs = []string{"/usr/local/sbin", "/usr/sbin", "/sbin"}

// Look finds program on PATH and then in SbinDirs and returns its path. A
// program named with a slash is only checked to be an executable file.
func Look(program string) (string, error) {
	if strings.Contains(program, "/") {
		if err := executable(program); err != nil {
			return "", err
		}
		return program, nil
	}
	if p, err := exec.LookPath(program); err == nil {
		return p, nil
	}
	for _, dir := range SbinDirs {
		p := filepath.Join(dir, program)
		if executable(p) == nil {
			return p, nil
		}
	}
	if len(SbinDirs) == 0 {
		return "", fmt.Errorf("%s is not on PATH", program)
	}
	return "", fmt.Errorf("%s is not on PATH or in %s", program, strings.Join(SbinDirs, ", "))
}

func executable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
		return &fs.PathError{Op: "exec", Path: p, Err: errors.New("not an executable file")}
	}
	return nil
}

// Required reports whether missing programs fail tests (KILN_REQUIRE_TOOLS=1).
func Required() bool { return os.Getenv(RequireEnv) == "1" }

// Need returns the path of program, found as Look finds it. When it is
// missing, t is skipped with hint (how to install it, such as "apt-get
// install docker-registry"), or, with KILN_REQUIRE_TOOLS=1, fails saying
// that the program is required.
func Need(t testing.TB, program, hint string) string {
	t.Helper()
	p, err := Look(program)
	if err == nil {
		return p
	}
	if Required() {
		t.Fatalf("%s is required (%s=1) but missing: %v; %s", program, RequireEnv, err, hint)
	}
	t.Skipf("%s is missing (%v): %s", program, err, hint)
	return ""
}
