package main

import (
	"bytes"
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kiln.dev/kiln/dra/kubetest"
)

// TestLabelApply labels a Node of a real apiserver twice: the second run,
// on a machine without NVIDIA GPUs, removes the labels kiln wrote and keeps
// another tool's.
func TestLabelApply(t *testing.T) {
	if _, err := kubetest.BinDir(); err != nil {
		t.Skip("no Kubernetes control plane: " + err.Error())
	}
	ctx := context.Background()
	dir := t.TempDir()
	cp, err := kubetest.Start(ctx, dir, kubetest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()
	if _, err := kubetest.AddNode(ctx, cp.Client, "n1"); err != nil {
		t.Fatal(err)
	}
	n, _ := cp.Client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	n.Labels["feature.node.kubernetes.io/cpu-model"] = "x"
	if _, err := cp.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	label := func(from string) map[string]string {
		var out, errb bytes.Buffer
		code := run(ctx, []string{"label", "--apply", "--node", "n1", "--kubeconfig", cp.Kubeconfig, "--from", from}, &out, &errb)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errb.String())
		}
		n, err := cp.Client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n.Labels
	}
	l := label("../../testdata/fixtures/h100-hgx8-sysfs")
	if l["kiln.dev/nvlink-island.max"] != "8" || l["nvidia.com/gpu.count"] != "8" || l["kiln.dev/doctor"] != "warning" {
		t.Errorf("labels after the HGX run: %v", l)
	}
	l = label("../../testdata/captures/kfd-topology/mi300x-x8-cpx.tar.gz")
	if _, ok := l["nvidia.com/gpu.count"]; ok {
		t.Errorf("kiln's nvidia.com labels left on a node without NVIDIA GPUs: %v", l)
	}
	if l["amd.com/gpu.count"] != "8" || l["kiln.dev/gfx-target"] != "gfx942" || l["feature.node.kubernetes.io/cpu-model"] != "x" {
		t.Errorf("labels after the MI300X run: %v", l)
	}
}
