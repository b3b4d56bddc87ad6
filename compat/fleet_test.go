package compat_test

import (
	"strings"
	"testing"

	"kiln.dev/kiln/compat"
	"kiln.dev/kiln/doctor"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

// The fleet's image findings name the nodes an image the lab read cannot
// run on, with each node's reason, and those kiln cannot judge; an image
// that runs everywhere, and a node without GPUs, give none.
func TestFleetImages(t *testing.T) {
	all := reqs(t)
	nodes := map[string]*snapshot.Snapshot{
		"h100-550": node(t, h100_550),
		"h100-535": node(t, h100_535),
		"rtx4090":  node(t, rtx4090_535),
		"blind":    withDriver(node(t, h100_550), "", ""),
		"cpu":      {Host: snapshot.Host{Hostname: "cpu"}},
	}
	got := compat.Fleet([]compat.Checked{
		{Ref: "lab/cuda124:1", Platform: "linux/amd64", Requirements: all["cuda124-official"]},
		{Ref: "lab/cpu:1", Requirements: all["cpu-only"]},
	}, nodes, kb.Default())
	byID := map[string]doctor.Finding{}
	for _, f := range got {
		if _, dup := byID[f.ID]; dup {
			t.Errorf("two %s findings", f.ID)
		}
		byID[f.ID] = f
		if strings.Contains(f.Title, "lab/cpu") {
			t.Errorf("an image that runs everywhere gave %s: %s", f.ID, f.Title)
		}
		if strings.Contains(f.Machine, "cpu") {
			t.Errorf("a node without GPUs is named: %s", f.Machine)
		}
	}
	fails, ok := byID["fleet-image-fails"]
	if !ok {
		t.Fatalf("no fleet-image-fails finding in %+v", got)
	}
	if fails.Machine != "rtx4090" || fails.Severity != doctor.Warning || !strings.Contains(fails.Title, "lab/cuda124:1 (linux/amd64) cannot run on 1 of 4 GPU nodes") {
		t.Errorf("fails: %s on %q (%s)", fails.Title, fails.Machine, fails.Severity)
	}
	if len(fails.Evidence) != 1 || !strings.HasPrefix(fails.Evidence[0], "rtx4090, driver 535.154.05") {
		t.Errorf("fails evidence: %q", fails.Evidence)
	}
	if fails.Remedy == "" || fails.Impact == "" {
		t.Errorf("fails without impact or remedy: %+v", fails)
	}
	unk, ok := byID["fleet-image-unknown"]
	if !ok {
		t.Fatalf("no fleet-image-unknown finding for the node whose driver kiln did not read: %+v", got)
	}
	if unk.Machine != "blind" || unk.Severity != doctor.Info {
		t.Errorf("unknown: %s on %q (%s)", unk.Title, unk.Machine, unk.Severity)
	}
	if len(compat.Fleet(nil, nodes, kb.Default())) != 0 {
		t.Error("findings without images")
	}
}
