// Package kilnbin builds the kiln command for the benchmark programs, as
// an installed binary is.
package kilnbin

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
)

// Build builds ./cmd/kiln into dir and returns the path of a copy written
// with plain writes, as an installed binary is (cp, install, a package
// manager). The Go linker writes its output through a memory map; on Linux
// 6.x those page-cache pages sit in large folios that a later run of the
// file maps whole, so the fresh output of go build measured about 10 MB
// more peak memory here than the same bytes copied (41 against 31 MB,
// kernel 6.18, ext4), and the same after the page cache was dropped.
func Build(dir string) (string, error) { return BuildAs(dir, "kiln") }

// BuildAs is Build with build tags (name "kiln-agent": -tags agentonly,
// as scripts/install.sh builds it), written as dir/name.
func BuildAs(dir, name string) (string, error) {
	built := filepath.Join(dir, name+"-built")
	args := []string{"build", "-o", built}
	if name == "kiln-agent" {
		args = append(args, "-tags", "agentonly")
	}
	build := exec.Command("go", append(args, "./cmd/kiln")...)
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("building kiln: %w", err)
	}
	bin := filepath.Join(dir, name)
	if err := copyFile(built, bin); err != nil {
		return "", fmt.Errorf("copying kiln: %w", err)
	}
	return bin, nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
