package modelstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A download is checked by its size and digest before it takes its
// place; a bad one leaves nothing.
func TestFetchBlob(t *testing.T) {
	dir := t.TempDir()
	body := "the weights"
	sum := sha256.Sum256([]byte(body))
	good := hex.EncodeToString(sum[:])
	blob := filepath.Join(dir, good)
	for name, tc := range map[string]struct {
		body string
		size int64
		want string
	}{
		"digest": {"the weighTs", int64(len(body)), "digest"},
		"short":  {"the weigh", int64(len(body)), "sent 9 of 11"},
		"long":   {body + "!", int64(len(body)), "more than"},
	} {
		_, err := fetchBlob(context.Background(), strings.NewReader(tc.body), blob, good, tc.size, func(int64) {})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", name, err)
		}
		if es, _ := os.ReadDir(dir); len(es) != 0 {
			t.Errorf("%s: left %d files", name, len(es))
		}
	}
	if _, err := fetchBlob(context.Background(), strings.NewReader(body), blob, good, int64(len(body)), func(int64) {}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(blob); err != nil || fi.Mode().Perm() != 0o444 {
		t.Errorf("the blob: %v, %v", fi, err)
	}
}

// Eviction leaves the blobs a pull under way has fetched and not yet
// linked into its model's folder.
func TestEvictLeavesPullsUnderWay(t *testing.T) {
	c := &Cache{Root: t.TempDir(), MaxBytes: 1}
	blobs := filepath.Join(c.Root, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	needed, stale := strings.Repeat("a", 64), strings.Repeat("b", 64)
	for _, h := range []string{needed, stale} {
		if err := os.WriteFile(filepath.Join(blobs, h), []byte("bytes"), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	release := c.hold([]File{{Path: "w", Digest: "sha256:" + needed, Size: 5}})
	if err := c.dropUnheld(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(blobs, needed)); err != nil {
		t.Errorf("a pull's blob was evicted: %v", err)
	}
	if _, err := os.Stat(filepath.Join(blobs, stale)); err == nil {
		t.Error("a blob no model holds was kept")
	}
	release()
	if err := c.dropUnheld(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(blobs, needed)); err == nil {
		t.Error("the blob stayed after its pull ended")
	}
}

// A model in use (PullPinned, not yet Released) is never evicted.
func TestEvictLeavesModelsInUse(t *testing.T) {
	c := &Cache{Root: t.TempDir(), MaxBytes: 1}
	used, idle := strings.Repeat("1", 64), strings.Repeat("2", 64)
	for _, h := range []string{used, idle} {
		if err := os.MkdirAll(filepath.Join(c.Root, "models", h), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.MkdirAll(filepath.Join(c.Root, "blobs", "sha256"), 0o755)
	os.WriteFile(filepath.Join(c.Root, "blobs", "sha256", strings.Repeat("3", 64)), []byte("xx"), 0o444)
	c.use("sha256:" + used)
	if _, err := c.Evict(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(c.Root, "models", used)); err != nil {
		t.Errorf("the model in use was evicted: %v", err)
	}
	if _, err := os.Stat(filepath.Join(c.Root, "models", idle)); err == nil {
		t.Error("the idle model was kept")
	}
	c.Release("sha256:" + used)
	os.WriteFile(filepath.Join(c.Root, "blobs", "sha256", strings.Repeat("4", 64)), []byte("xx"), 0o444)
	if _, err := c.Evict(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(c.Root, "models", used)); err == nil {
		t.Error("the released model was kept past the bound")
	}
}
