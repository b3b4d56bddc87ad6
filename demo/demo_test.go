package demo

import (
	"bytes"
	"context"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"kiln.dev/kiln/capture"
	"kiln.dev/kiln/discover"
	"kiln.dev/kiln/snapshot"
)

var update = flag.Bool("update", false, "write machines/*.json again from the fixtures")

// read returns the Snapshot of m's fixture as kiln reads it, encoded; the
// working directory is the repository root.
func read(t *testing.T, m Machine) []byte {
	t.Helper()
	ctx := context.Background()
	var s *snapshot.Snapshot
	var err error
	if discover.IsBundle(m.Fixture) {
		s, err = discover.Replay(ctx, m.Fixture)
	} else {
		s, err = capture.Load(ctx, m.Fixture)
	}
	if err != nil {
		t.Fatalf("%s: %v", m.Fixture, err)
	}
	var b bytes.Buffer
	if err := snapshot.Encode(&b, s); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// The embedded Snapshots are what kiln reads from the fixtures today.
func TestMachinesMatchFixtures(t *testing.T) {
	pkg, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir("..")
	for _, m := range Machines() {
		want := read(t, m)
		if *update {
			if err := os.WriteFile(filepath.Join(pkg, m.file()), want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := files.ReadFile(m.file())
		if err != nil {
			t.Fatalf("%s: %v (go test ./demo -update writes it)", m.Node, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from what kiln reads from %s: go test ./demo -update writes it again", m.file(), m.Fixture)
		}
	}
}

// Every machine decodes to a machine with GPUs, a copy per call, and the
// binary carries no file that no machine uses.
func TestMachines(t *testing.T) {
	ms := Machines()
	if len(ms) == 0 {
		t.Fatal("no demo machine")
	}
	var names []string
	for _, m := range ms {
		if slices.Contains(names, m.file()) {
			t.Errorf("two machines are named %s", m.Node)
		}
		names = append(names, m.file())
		a, err := m.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if len(a.GPUs) == 0 {
			t.Errorf("%s has no GPU", m.Node)
			continue
		}
		// Decoding loses nothing: the Snapshot encodes to the same bytes.
		var again bytes.Buffer
		if err := snapshot.Encode(&again, a); err != nil {
			t.Fatal(err)
		}
		if raw, _ := files.ReadFile(m.file()); !bytes.Equal(again.Bytes(), raw) {
			t.Errorf("%s does not decode to the Snapshot it holds", m.file())
		}
		b, err := m.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		b.GPUs[0].Model = "changed"
		if a.GPUs[0].Model == "changed" {
			t.Errorf("%s: two calls share one Snapshot", m.Node)
		}
	}
	embedded, err := fs.Glob(files, "machines/*")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range embedded {
		if !slices.Contains(names, f) {
			t.Errorf("%s is embedded but no demo machine uses it", f)
		}
	}
	// Machines hands out a copy: a caller cannot change the list.
	ms[0].Node = "changed"
	if Machines()[0].Node == "changed" {
		t.Error("Machines returns the package's own list")
	}
}
