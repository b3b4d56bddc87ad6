package capture

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"io/fs"
	"testing"
)

// tarGz packs files (name to content) as a gzip'd tar.
func tarGz(t testing.TB, files map[string]string) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestUntarGzStripsTopFolder(t *testing.T) {
	data := tarGz(t, map[string]string{
		"box/topology/nodes/0/properties": "cpu_cores_count 8\n",
		"box/topology/generation_id":      "3\n",
	})
	fsys, err := untarGz(data)
	if err != nil {
		t.Fatal(err)
	}
	b, err := fs.ReadFile(fsys, "topology/nodes/0/properties")
	if err != nil || string(b) != "cpu_cores_count 8\n" {
		t.Fatalf("topology/nodes/0/properties: %q, %v", b, err)
	}
	if _, err := untarGz(tarGz(t, map[string]string{"../escape": "x"})); err == nil {
		t.Error("a tar entry leaving its folder was accepted")
	}
	if _, err := untarGz([]byte{0x1f, 0x8b, 0, 1, 2}); err == nil {
		t.Error("a broken gzip stream was accepted")
	}
}

// FuzzUntarGz: any bytes give a file tree or an error, never a panic, and
// every file the tree lists can be read back.
func FuzzUntarGz(f *testing.F) {
	f.Add(tarGz(f, map[string]string{
		"box/topology/nodes/0/properties":            "cpu_cores_count 8\nsimd_count 0\n",
		"box/topology/nodes/1/io_links/0/properties": "type 11\nnode_from 1\nnode_to 0\n",
	}))
	f.Add(tarGz(f, map[string]string{"a": "1", "b/c": "2"}))
	f.Add([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3})
	f.Add([]byte{}) // an empty input panicked
	f.Fuzz(func(t *testing.T, data []byte) {
		fsys, err := untarGz(data)
		if err != nil {
			return
		}
		err = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() {
				if _, err := fs.ReadFile(fsys, p); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("walking the unpacked tree: %v", err)
		}
	})
}

// BenchmarkLoadKFDTarball: the MI300X CPX capture, 8,268 tar entries
// (gunzip, untar, read the KFD tree): what kiln doctor --from spends on it.
func BenchmarkLoadKFDTarball(b *testing.B) {
	for b.Loop() {
		if _, err := Load(context.Background(), "../testdata/captures/kfd-topology/mi300x-x8-cpx.tar.gz"); err != nil {
			b.Fatal(err)
		}
	}
}

// untarGz unpacks a gzip'd tar, as Read does for a .tar.gz.
func untarGz(data []byte) (fs.FS, error) {
	plain, err := decompress(data)
	if err != nil {
		return nil, err
	}
	return untar(plain)
}
