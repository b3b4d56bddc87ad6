package plugin

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzCheckpoint reads whatever a checkpoint file holds: a damaged file is
// an error that says what to do, never a panic or a half-read state.
func FuzzCheckpoint(f *testing.F) {
	f.Add([]byte(`{"claims":{"uid-1":{"namespace":"default","name":"c","spec_file":"/var/run/cdi/kiln.dev-claim-uid-1.json","devices":[{"requests":["gpus"],"pool":"n1","device":"gpu-0","cdi_ids":["kiln.dev/gpu=uid-1-gpu-0"]}]}}}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"claims":null}`))
	f.Add([]byte(`{"claims":{"x":`))
	f.Add([]byte{0xff, 0xfe})
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(t.TempDir(), checkpointFile)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		ck, err := loadCheckpoint(p)
		if err != nil {
			return
		}
		if ck.Claims == nil {
			t.Fatal("a checkpoint read without error has no claims map")
		}
		if err := ck.save(); err != nil {
			t.Fatal(err)
		}
		again, err := loadCheckpoint(p)
		if err != nil || len(again.Claims) != len(ck.Claims) {
			t.Fatalf("saved checkpoint reads back as %v, %v", again, err)
		}
	})
}
