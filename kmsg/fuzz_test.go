package kmsg

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kiln.dev/kiln/snapshot"
)

func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob(captures + "*.log")
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		// Small seeds keep the fuzzer fast; the boot log's start has its
		// PCI enumeration lines.
		f.Add(b[:min(len(b), 4<<10)])
	}
	f.Add([]byte("6,1,2,-;NVRM: The NVIDIA GPU 0000:01:00.0\\x0aNVRM: fallen off the bus\n DEVICE=+pci:0000:01:00.0\n"))
	f.Add([]byte("Feb 27 15:10:02 h kernel: pcieport 0000:00:01.1: AER: Corrected error received: 0000:01:00.0\n"))
	f.Add([]byte("[ 1.0] amdgpu 0000:c1:00.0: amdgpu: ring gfx timeout\n[ 1.0] amdgpu 0000:c1:00.0: amdgpu:  Process x pid 9 thread\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := Parse(strings.NewReader(string(data)))
		if err != nil {
			t.Fatalf("Parse of an in-memory reader failed: %v", err)
		}
		if l.Lines < 0 || l.Dropped < 0 || len(l.Events) > MaxEvents {
			t.Fatalf("bad counts: lines %d dropped %d events %d", l.Lines, l.Dropped, len(l.Events))
		}
		canon := func(what, a string) {
			if a == "" {
				return
			}
			if c, err := snapshot.CanonicalPCI(a); err != nil || c != a {
				t.Fatalf("%s address %q is not canonical", what, a)
			}
		}
		for _, e := range l.Events {
			canon("event", e.Device)
			if e.Kind == "" || e.Code < 0 || e.PID < 0 || len(e.Message) > MaxLine+maxMessage {
				t.Fatalf("bad event %+v", e)
			}
		}
		for _, p := range l.PCI {
			canon("pci", p.Address)
		}
		for _, d := range l.Devices {
			canon("device", d.Address)
		}
		if l.NVIDIA != nil && l.NVIDIA.Version == "" {
			t.Fatal("driver fact without a version")
		}
	})
}
