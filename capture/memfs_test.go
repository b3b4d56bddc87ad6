package capture

import (
	"io/fs"
	"testing"
	"testing/fstest"
)

func TestMemFS(t *testing.T) {
	m := newMemFS(map[string][]byte{
		"topology/nodes/0/properties":            []byte("cpu_cores_count 64\n"),
		"topology/nodes/0/io_links/0/properties": []byte("type 1\n"),
		"topology/nodes/1/properties":            []byte("simd_count 304\n"),
		"topology/generation_id":                 []byte("1\n"),
	})
	if err := fstest.TestFS(m, "topology/nodes/0/properties", "topology/nodes/0/io_links/0/properties", "topology/nodes/1/properties", "topology/generation_id"); err != nil {
		t.Fatal(err)
	}
	es, err := fs.ReadDir(m, "topology/nodes")
	if err != nil || len(es) != 2 || es[0].Name() != "0" || !es[0].IsDir() {
		t.Fatalf("ReadDir: %v %v", es, err)
	}
	if _, err := m.Open("topology/missing"); err == nil {
		t.Fatal("opened a missing file")
	}
}
