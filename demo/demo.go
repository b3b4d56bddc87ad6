// Package demo holds the recorded machines that kiln up --demo replays, as
// Snapshots built into the binary, so that the demo runs wherever kiln is
// installed, not only in its source tree.
//
// Each machines/*.json is the Snapshot kiln reads from one of its fixtures
// (Machine.Fixture), written by this package's test: go test ./demo -update
// writes them again after the fixtures or the readers change, and a plain go
// test fails while they differ. README.md says where each fixture comes from
// and under which licence.
package demo

import (
	"bytes"
	"embed"
	"fmt"
	"slices"

	"kiln.dev/kiln/snapshot"
)

//go:embed machines/*.json
var files embed.FS

// Machine is a recorded machine the demo replays.
type Machine struct {
	// Node is the name its agent joins as.
	Node string
	// What says in a few words what machine it is.
	What string
	// Fixture is the capture or bundle in kiln's source tree its Snapshot
	// is read from.
	Fixture string
}

var machines = []Machine{
	{"demo-hgx-h100", "an 8-GPU H100 HGX server (NVSwitch)", "testdata/fixtures/h100-hgx8-sysfs"},
	{"demo-mi300x", "an 8-GPU MI300X server in CPX mode", "testdata/captures/kfd-topology/mi300x-x8-cpx.tar.gz"},
	{"demo-pcie-l40s", "a 4-GPU L40S PCIe box with a downtrained link and ACS on", "testdata/fixtures/pcie4-downtrained-acs"},
}

// Machines lists the recorded machines, in the order the demo starts them.
func Machines() []Machine { return slices.Clone(machines) }

// file is the embedded file that holds m's Snapshot.
func (m Machine) file() string { return "machines/" + m.Node + ".json" }

// Snapshot decodes m's Snapshot; every call returns a copy of its own.
func (m Machine) Snapshot() (*snapshot.Snapshot, error) {
	b, err := files.ReadFile(m.file())
	if err != nil {
		return nil, fmt.Errorf("demo machine %s: %w", m.Node, err)
	}
	s, err := snapshot.Decode(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("demo machine %s: %w", m.Node, err)
	}
	return s, nil
}
