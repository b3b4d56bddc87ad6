package openapitest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// generateCommand is the command of doc.go's go:generate line, split in
// words: go run <generator>@<version> ... -o client.gen.go <spec>.
func generateCommand(t *testing.T) []string {
	t.Helper()
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(src), "\n") {
		if rest, ok := strings.CutPrefix(line, "//go:generate "); ok {
			words := strings.Fields(rest)
			if len(words) < 3 || words[0] != "go" || words[1] != "run" || !strings.Contains(words[2], "@v") {
				t.Fatalf("doc.go: the go:generate line %q does not run a pinned generator", line)
			}
			return words
		}
	}
	t.Fatal("doc.go has no go:generate line")
	return nil
}

// TestGeneratedClientCurrent: client.gen.go is what the generator makes of
// the current api/openapi.yaml, so that the description and the client the
// live tests use cannot drift apart. It runs the generator from the module
// cache only (never from the network) and is skipped where the cache lacks
// it; scripts/openapi.sh fetches the generator and runs this test.
func TestGeneratedClientCurrent(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the generator")
	}
	words := generateCommand(t)
	out := filepath.Join(t.TempDir(), "client.gen.go")
	found := false
	for i, w := range words {
		if w == "-o" && i+1 < len(words) {
			if words[i+1] != "client.gen.go" {
				t.Fatalf("doc.go generates into %s, want client.gen.go", words[i+1])
			}
			words[i+1] = out
			found = true
		}
	}
	if !found {
		t.Fatal("doc.go's go:generate line names no output file (-o)")
	}
	modcache, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatalf("go env GOMODCACHE: %v", err)
	}
	// The module cache's download folder serves as a proxy: what it lacks
	// is not looked up anywhere else. Its modules were checked against the
	// checksum database when they were fetched.
	proxy := "file://" + filepath.ToSlash(filepath.Join(strings.TrimSpace(string(modcache)), "cache", "download"))
	cmd := exec.Command(words[0], words[1:]...)
	cmd.Env = append(os.Environ(), "GOPROXY="+proxy, "GOSUMDB=off", "GOFLAGS=", "GOWORK=off")
	msg, err := cmd.CombinedOutput()
	if err != nil {
		if bytes.Contains(msg, []byte(proxy)) {
			t.Skipf("the generator %s is not in the module cache (scripts/openapi.sh fetches it and runs this test): %s", words[2], bytes.TrimSpace(msg))
		}
		t.Fatalf("%s: %v\n%s", strings.Join(words, " "), err, msg)
	}
	want, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	have, err := os.ReadFile("client.gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, want) {
		t.Fatalf("client.gen.go is not what %s makes of api/openapi.yaml: run 'go generate ./api/openapitest' and commit the result", words[2])
	}
}
