package plan

import (
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"kiln.dev/kiln/kb"
)

// catalogKeys are the keys of a kb/data/gpus.yaml row, from kb.GPUModel's
// field tags.
func catalogKeys() map[string]bool {
	keys := map[string]bool{}
	t := reflect.TypeFor[kb.GPUModel]()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			keys[name] = true
		}
	}
	return keys
}

// TestGPUTableJoinsCatalog ties every row of plan/data/gpus.yaml to a row of
// the GPU catalog: the catalog has a row of that name, and no figure the
// catalog holds (memory, bandwidth, anything of kb.GPUModel but the name and
// the source) is given again in the plan table.
func TestGPUTableJoinsCatalog(t *testing.T) {
	var doc struct {
		Rows []map[string]any `json:"rows"`
	}
	if err := yaml.Unmarshal(gpusYAML, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Rows) == 0 {
		t.Fatal("plan/data/gpus.yaml has no rows")
	}
	k := kb.Default()
	catalog := map[string]kb.GPUModel{}
	for _, m := range k.GPUs {
		catalog[m.Name] = m
	}
	keys := catalogKeys()
	for _, row := range doc.Rows {
		name, _ := row["name"].(string)
		m, ok := catalog[name]
		if !ok {
			t.Errorf("plan row %q: no kb/data/gpus.yaml row of that name", name)
			continue
		}
		for key := range row {
			if keys[key] && key != "name" && key != "source" {
				t.Errorf("plan row %q gives %s, which kb/data/gpus.yaml holds: give it there only", name, key)
			}
		}
		p, ok := GPUByName(name, nil)
		if !ok {
			t.Errorf("plan row %q did not load", name)
			continue
		}
		if p.MemoryGB != m.MemoryGB || p.MemoryBandwidthGBps != m.MemoryBandwidthGBps || p.MemoryGB <= 0 || p.MemoryBandwidthGBps <= 0 {
			t.Errorf("%s: plan has %v GB at %v GB/s, the catalog %v GB at %v GB/s", name, p.MemoryGB, p.MemoryBandwidthGBps, m.MemoryGB, m.MemoryBandwidthGBps)
		}
	}
}

// TestJoinPerfRefuses: the loader itself refuses a plan row that repeats a
// catalog figure, names a GPU the catalog lacks, or one the catalog has no
// memory figures for.
func TestJoinPerfRefuses(t *testing.T) {
	k := &kb.KB{GPUs: []kb.GPUModel{
		{Name: "G1", MemoryGB: 80, MemoryBandwidthGBps: 2000},
		{Name: "G2", MemoryGB: 80},
	}}
	const good = "rows:\n  - {name: G1, tflops: {fp32: 10}, attainable: 0.5, source: s}\n"
	rows, err := joinPerf([]byte(good), k)
	if err != nil || len(rows) != 1 || rows[0].MemoryGB != 80 || rows[0].MemoryBandwidthGBps != 2000 {
		t.Fatalf("good table: %+v, %v", rows, err)
	}
	for name, data := range map[string]string{
		"memory again":    "rows:\n  - {name: G1, tflops: {fp32: 10}, memory_gb: 80, attainable: 0.5, source: s}\n",
		"bandwidth again": "rows:\n  - {name: G1, tflops: {fp32: 10}, memory_bandwidth_gbps: 2000, attainable: 0.5, source: s}\n",
		"no catalog row":  "rows:\n  - {name: G9, tflops: {fp32: 10}, attainable: 0.5, source: s}\n",
		"no bandwidth":    "rows:\n  - {name: G2, tflops: {fp32: 10}, attainable: 0.5, source: s}\n",
	} {
		if _, err := joinPerf([]byte(data), k); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
}
