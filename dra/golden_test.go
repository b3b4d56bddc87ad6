package dra_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"kiln.dev/kiln/discover"
	"kiln.dev/kiln/dra"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/source"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

// machine is a recorded machine the golden files cover.
type machine struct {
	name   string   // golden file and node name
	paths  []string // relative to the repository root
	shared []int    // GPUs published as fractions
}

// machines are the recorded machines of the golden files: HGX boards with
// NVSwitches (a recorded tree, nvidia-smi -q, a topo -m matrix), PCIe pairs
// under switches with a NIC beside them, consumer cards on separate roots,
// MIG with instances and MIG without, MI300X in SPX and CPX, MI210 in
// xGMI hives, a machine with a critical Xid and one with a mixed load, and
// that machine again with half its GPUs shared as fractions.
var machines = []machine{
	{"hgx-h100-sysfs", []string{"testdata/fixtures/h100-hgx8-sysfs"}, nil},
	{"hgx-h100-smi", []string{"testdata/captures/nvidia-smi-q/h100x8-535.183.01-gpu75-slowdown.txt"}, nil},
	{"hgx-a100-topo", []string{"testdata/captures/nvidia-smi-topo/a100x8-nv12-17nic-topo-m.txt"}, nil},
	{"pcie-l40s-pairs", []string{"testdata/fixtures/pcie4-downtrained-acs"}, nil},
	{"pcie-rtx4090-two-roots", []string{"testdata/fixtures/consumer2-nop2p"}, nil},
	{"mig-a100-instances", []string{"testdata/captures/nvidia-smi-q-xml/a100-sxm4-80gb-mig-535.54.03.xml"}, nil},
	{"mig-h100-no-instances", []string{"testdata/captures/nvidia-smi-q/h100-vm-mig-4-instances-590.48.01-replays9-load.txt"}, nil},
	{"mi300x-spx", []string{"testdata/captures/amd-smi/mi300x-x8-rocm7.2.1-static.json"}, nil},
	{"mi300x-spx-rocm-smi", []string{"testdata/captures/rocm-smi/mi300x-x8-concise.txt"}, nil},
	{"mi300x-cpx", []string{"testdata/captures/kfd-topology/mi300x-x8-cpx.tar.gz"}, nil},
	{"mi210-xgmi-pcie", []string{"testdata/captures/kfd-topology/mi210-x8-xgmi-pcie"}, nil},
	{"rtx2080ti-xid-critical", []string{"testdata/captures/nvidia-bug-report/rtx2080ti-x4-440.31-xid62-xid13-xid31.log"}, nil},
	{"rtx4090x8-mixed-load", []string{"testdata/captures/nvidia-smi-q/rtx4090x8-535.154.05-mixed-load.txt"}, nil},
	{"rtx4090x8-shared", []string{"testdata/captures/nvidia-smi-q/rtx4090x8-535.154.05-mixed-load.txt"}, []int{0, 1, 2, 3}},
}

func machineByName(t testing.TB, name string) machine {
	t.Helper()
	for _, m := range machines {
		if m.name == name {
			return m
		}
	}
	t.Fatalf("no recorded machine %q", name)
	return machine{}
}

func repoPath(p string) string { return filepath.Join("..", p) }

// loadMachine reads a recorded machine as kiln-dra slices --from does.
func loadMachine(t testing.TB, m machine) *snapshot.Snapshot {
	t.Helper()
	var paths []string
	for _, p := range m.paths {
		paths = append(paths, repoPath(p))
	}
	s, err := source.Load(context.Background(), paths, discover.Options{})
	if err != nil {
		t.Fatalf("%s: %v", m.name, err)
	}
	return s
}

func buildMachine(t testing.TB, m machine) *dra.Result {
	t.Helper()
	r, err := dra.Build(context.Background(), dra.Input{Snapshot: loadMachine(t, m), NodeName: m.name, Shared: m.shared})
	if err != nil {
		t.Fatalf("%s: %v", m.name, err)
	}
	return r
}

// TestGolden keeps the ResourceSlices of every recorded machine as golden
// files (go test ./dra -run TestGolden -update rewrites them).
func TestGolden(t *testing.T) {
	for _, m := range machines {
		t.Run(m.name, func(t *testing.T) {
			r := buildMachine(t, m)
			if err := dra.ValidateSlices(r.Slices); err != nil {
				t.Fatal(err)
			}
			got, err := json.MarshalIndent(struct {
				Notes  []string `json:"notes,omitempty"`
				Slices any      `json:"slices"`
			}{r.Notes, r.Objects()}, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			p := filepath.Join("testdata", "golden", m.name+".json")
			if *update {
				if err := os.WriteFile(p, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(p)
			if err != nil {
				t.Fatalf("%v (run go test ./dra -run TestGolden -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from the golden file; run go test ./dra -run TestGolden -update and review the diff\n%s", p, firstDiff(got, want))
			}
		})
	}
}

func firstDiff(a, b []byte) string {
	la, lb := bytes.Split(a, []byte("\n")), bytes.Split(b, []byte("\n"))
	for i := 0; i < len(la) || i < len(lb); i++ {
		var x, y []byte
		if i < len(la) {
			x = la[i]
		}
		if i < len(lb) {
			y = lb[i]
		}
		if !bytes.Equal(x, y) {
			return fmt.Sprintf("line %d:\n got: %s\nwant: %s", i+1, x, y)
		}
	}
	return ""
}
