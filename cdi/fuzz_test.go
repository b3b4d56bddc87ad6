package cdi

import (
	"bytes"
	"encoding/json"
	"errors"
	"path"
	"strings"
	"testing"
	"testing/fstest"

	"tags.cncf.io/container-device-interface/pkg/parser"

	"kiln.dev/kiln/snapshot"
)

// FuzzGenerate feeds snapshots (seeded with the real captures) to Generate
// on a host that knows some GPUs and not others, and checks that a spec it
// returns is one a runtime accepts, with unique names and nodes under /dev.
func FuzzGenerate(f *testing.F) {
	var hosts []fstest.MapFS
	for _, p := range []string{h100Capture, migCapture, mi210KFD} {
		s := load(f, p)
		b, err := json.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, false)
		f.Add(b, true)
	}
	h100 := load(f, h100Capture)
	hosts = append(hosts, nvidiaHost(h100), kfdHost(f, mi210KFD))
	root := fstest.MapFS{}
	for _, h := range hosts {
		for k, v := range h {
			root[k] = v
		}
	}
	f.Add([]byte(`{"gpus":[{"index":-3,"vendor":"nvidia","uuid":"-x"},{"index":300,"vendor":"amd","kfd_nodes":[-1,99999999999]}]}`), true)
	f.Add([]byte(`{"gpus":[{"index":0,"vendor":"nvidia","pci_address":"../../etc","mig":{"enabled":true,"instances":[{"gi":-1,"ci":0},{"gi":1,"ci":0},{"gi":1,"ci":0}]}}]}`), true)

	f.Fuzz(func(t *testing.T, data []byte, assume bool) {
		s, err := snapshot.Decode(bytes.NewReader(data))
		if err != nil {
			return
		}
		res, err := Generate(s, Options{Root: root, AssumeNodes: assume, NVIDIALibraries: []string{"/usr/lib/libcuda.so.1", "x"}})
		if err != nil {
			if !errors.Is(err, ErrNoDevices) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			if res == nil || res.Spec != nil || len(res.Devices) != 0 {
				t.Fatalf("failed generation returned devices: %+v", res)
			}
			return
		}
		if err := Validate(res.Spec); err != nil {
			t.Fatalf("generated spec is not valid: %v", err)
		}
		if len(res.Devices) != len(res.Spec.Devices) {
			t.Fatalf("%d devices described, %d in spec", len(res.Devices), len(res.Spec.Devices))
		}
		seen := map[string]bool{}
		for i, d := range res.Spec.Devices {
			if err := parser.ValidateDeviceName(d.Name); err != nil || seen[d.Name] {
				t.Fatalf("device name %q invalid or repeated (%v)", d.Name, err)
			}
			seen[d.Name] = true
			if res.Devices[i].QualifiedName != "kiln.dev/gpu="+d.Name {
				t.Fatalf("qualified name %q for %q", res.Devices[i].QualifiedName, d.Name)
			}
			if len(d.ContainerEdits.DeviceNodes) == 0 {
				t.Fatalf("device %q has no nodes", d.Name)
			}
			for _, n := range d.ContainerEdits.DeviceNodes {
				if !strings.HasPrefix(n.Path, "/dev/") || path.Clean(n.Path) != n.Path || n.Major < 0 || n.Minor < 0 {
					t.Fatalf("device %q node %+v", d.Name, n)
				}
			}
		}
		if !seen[AllDevices] {
			t.Fatal(`no "all" device`)
		}
	})
}
