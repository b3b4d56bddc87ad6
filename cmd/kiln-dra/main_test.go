package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
)

func TestSlicesCommand(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"slices", "-o", "json", "--from", "../../testdata/fixtures/h100-hgx8-sysfs"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var list struct {
		Kind  string                      `json:"kind"`
		Items []resourceapi.ResourceSlice `json:"items"`
	}
	if err := json.Unmarshal(out.Bytes(), &list); err != nil {
		t.Fatal(err)
	}
	if list.Kind != "List" || len(list.Items) != 1 || len(list.Items[0].Spec.Devices) != 8 {
		t.Fatalf("got %s with %d slices", list.Kind, len(list.Items))
	}
	if n := *list.Items[0].Spec.NodeName; n != "hgx-h100-03" {
		t.Errorf("node %q, want the recorded host name", n)
	}

	out.Reset()
	errb.Reset()
	code = run(context.Background(), []string{"slices", "--from", "../../testdata/captures/nvidia-smi-q/h100x8-535.183.01-gpu75-slowdown.txt"}, &out, &errb)
	if code != 3 || !strings.Contains(errb.String(), "--node") {
		t.Errorf("a capture without a host name: exit %d, %q; want 3 and a hint to give --node", code, errb.String())
	}
	out.Reset()
	code = run(context.Background(), []string{"slices", "--node", "n1", "--from", "../../testdata/captures/nvidia-smi-q/h100x8-535.183.01-gpu75-slowdown.txt"}, &out, &errb)
	if code != 0 || !strings.Contains(out.String(), "kind: ResourceSlice") || !strings.Contains(out.String(), "nodeName: n1") {
		t.Errorf("yaml preview: exit %d\n%s", code, out.String())
	}
}

// TestDeployDeviceClasses keeps deploy/deviceclasses.yaml what kiln-dra
// classes prints.
func TestDeployDeviceClasses(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"classes"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	b, err := os.ReadFile("../../deploy/deviceclasses.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, out.Bytes()) {
		t.Errorf("deploy/deviceclasses.yaml differs from kiln-dra classes: run go run ./cmd/kiln-dra classes > deploy/deviceclasses.yaml")
	}
}

// An error that carries an outside string (here a file name with a
// terminal's title sequence) reaches the terminal escaped.
func TestErrorLineEscaped(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"slices", "--from", "no-such-\x1b]0;owned\x07-file"}, &out, &errb)
	if code == 0 {
		t.Fatal("a missing capture was accepted")
	}
	if strings.ContainsAny(errb.String(), "\x1b\x07") || !strings.Contains(errb.String(), `no-such-\x1b]0;owned\x07-file`) {
		t.Errorf("stderr %q", errb.String())
	}
}
