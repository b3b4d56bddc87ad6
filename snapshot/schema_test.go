package snapshot

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/invopop/jsonschema"
)

var update = flag.Bool("update", false, "rewrite schema.json from the Go types")

func generateSchema(t *testing.T) []byte {
	t.Helper()
	r := &jsonschema.Reflector{DoNotReference: false, AllowAdditionalProperties: false}
	s := r.Reflect(&Snapshot{})
	s.ID = "https://kiln.dev/schema/snapshot-v1.json"
	s.Title = "kiln node snapshot"
	s.Description = "One node: host, driver stack, GPUs, links, PCIe tree and kernel events (schema_version 1)."
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// TestSchemaUpToDate fails when the Go model changed and schema.json was not
// regenerated (go test ./snapshot -run Schema -update).
func TestSchemaUpToDate(t *testing.T) {
	want := generateSchema(t)
	if *update {
		if err := os.WriteFile("schema.json", want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	have, err := os.ReadFile("schema.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, want) {
		t.Fatal("snapshot/schema.json is stale: run go test ./snapshot -run TestSchemaUpToDate -update")
	}
	if !strings.Contains(string(want), `"schema_version"`) {
		t.Fatal("schema lacks schema_version")
	}
}

func TestDecodeRejects(t *testing.T) {
	cases := map[string]string{
		"no version":  `{"gpus":[]}`,
		"newer":       `{"schema_version": 99, "gpus":[]}`,
		"unknown key": `{"schema_version": 1, "gpus":[], "gpu_count": 3}`,
		"not json":    `nvidia-smi`,
	}
	for name, in := range cases {
		if _, err := Decode(strings.NewReader(in)); err == nil {
			t.Errorf("%s: Decode accepted %q", name, in)
		}
	}
	s, err := Decode(strings.NewReader(`{"schema_version": 1, "gpus":[{"index":0,"vendor":"nvidia","pci_address":"0000:01:00.0"}]}`))
	if err != nil || len(s.GPUs) != 1 {
		t.Fatalf("Decode valid: %v %+v", err, s)
	}
}

func TestMergeJoinsByPCIAndFills(t *testing.T) {
	a := New()
	a.GPUs = []GPU{{Vendor: VendorNVIDIA, PCIAddress: "0000:19:00.0", Model: "NVIDIA H100 80GB HBM3", VBIOS: "96.00.74.00.01"}}
	b := New()
	b.GPUs = []GPU{
		{Vendor: VendorNVIDIA, PCIAddress: "0000:19:00.0", DeviceID: "2330", PCIe: &PCIeLink{MaxGen: 5, MaxWidth: 16}},
		{Vendor: VendorNVIDIA, PCIAddress: "0000:3b:00.0", DeviceID: "2330"},
	}
	b.Events = []Event{{Kind: EventXid, Code: 79, Device: "0000:3b:00.0", Message: "x"}}
	m := Merge(a, b)
	if len(m.GPUs) != 2 {
		t.Fatalf("want 2 GPUs, got %d", len(m.GPUs))
	}
	g := m.GPUs[0]
	if g.Model != "NVIDIA H100 80GB HBM3" || g.DeviceID != "2330" || g.PCIe == nil || g.PCIe.MaxGen != 5 {
		t.Fatalf("fields not filled: %+v", g)
	}
	if len(m.Events) != 1 || m.SchemaVersion != SchemaVersion {
		t.Fatalf("events/version: %+v", m)
	}
	// The first source wins for fields both set.
	c := New()
	c.GPUs = []GPU{{PCIAddress: "0000:19:00.0", VBIOS: "other"}}
	if got := Merge(a, c).GPUs[0].VBIOS; got != "96.00.74.00.01" {
		t.Fatalf("first source should win, got %q", got)
	}
}
