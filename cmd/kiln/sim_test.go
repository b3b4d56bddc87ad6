package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const simTrace = "../../../shared/traces/alibaba-gpu-2023"

func TestSimJSON(t *testing.T) {
	if _, err := os.Stat(simTrace); err != nil {
		t.Skipf("the Alibaba GPU trace is not at %s (research-use data, kept outside the repository)", simTrace)
	}
	dir := t.TempDir()
	csvPath := filepath.Join(dir, "curve.csv")
	// The default --trace is found from the repository root.
	out, stderr, code := kiln(t, "sim", "--policies", "bestfit,fgd", "--seeds", "42", "-o", "json", "--csv", csvPath)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var rows []map[string]any
	if err := json.Unmarshal(out, &rows); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(rows) != 2 || rows[1]["policy"] != "fgd" || rows[0]["trace"] != "default" {
		t.Fatalf("rows %v", rows)
	}
	for _, k := range []string{"alloc_100_mean", "alloc_100_sd", "alloc_130_mean", "alloc_130_sd"} {
		if _, ok := rows[1][k].(float64); !ok {
			t.Errorf("row lacks %s: %v", k, rows[1])
		}
	}
	if a := rows[1]["alloc_130_mean"].(float64); a < 94.5 || a > 96.5 {
		t.Errorf("FGD at 130%% = %.2f, published 95.39", a)
	}
	b, err := os.ReadFile(csvPath)
	if err != nil || !strings.HasPrefix(string(b), "trace,policy,arrived_pct") {
		t.Errorf("CSV: %v %q", err, b)
	}
	out, _, code = kiln(t, "sim", "--trace", simTrace, "--policies", "random,kiln", "--seeds", "42", "--ratio", "1")
	if code != 0 || !strings.Contains(string(out), "alloc@130%") || !strings.Contains(string(out), "kiln") {
		t.Errorf("text table (exit %d):\n%s", code, out)
	}
}

func TestSimBadFlags(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"sim", "--policies", "fgd,magic"}, `unknown policy "magic"`},
		{[]string{"sim", "--seeds", "x"}, `cannot read "x" as a seed`},
		{[]string{"sim", "--seeds", "51-42"}, "seed range"},
		{[]string{"sim", "--trace", "/nonexistent"}, "no such folder"},
		{[]string{"sim", "--mode", "live"}, "want inflate or replay"},
		{[]string{"sim", "-o", "xml"}, "want one of text, json, yaml"},
	}
	for _, c := range cases {
		_, stderr, code := kiln(t, c.args...)
		if code != 3 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 3 and %q", c.args, code, stderr, c.want)
		}
	}
	if _, err := os.Stat(simTrace); err == nil {
		_, stderr, code := kiln(t, "sim", "--trace", simTrace, "--pods", "nosuch")
		if code != 3 || !strings.Contains(stderr, "no openb_pod_list_nosuch.csv") {
			t.Errorf("--pods nosuch: exit %d %q", code, stderr)
		}
	}
}
