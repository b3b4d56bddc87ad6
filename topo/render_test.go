package topo

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"kiln.dev/kiln/snapshot"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

var renderCases = []struct {
	name string
	snap func() *snapshot.Snapshot
}{
	{"hgx-h100", hgxH100},
	{"two-switches", twoSwitches},
	{"consumer-node", func() *snapshot.Snapshot { return consumerPair(false, 0) }},
	{"mi210-hives", mi210Hives},
	{"b300-topo-m", b300TopoM},
}

// bareGBps finds "GB/s" not followed by " (uni)" or " (bidi)".
var qualified = regexp.MustCompile(`GB/s \((uni|bidi)\)`)

func assertQualified(t *testing.T, what, text string) {
	t.Helper()
	all := strings.Count(text, "GB/s")
	ok := len(qualified.FindAllString(text, -1))
	if all != ok {
		for _, line := range strings.Split(text, "\n") {
			if strings.Count(line, "GB/s") != len(qualified.FindAllString(line, -1)) {
				t.Errorf("%s: bare GB/s in %q", what, line)
				break
			}
		}
	}
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./topo -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file; run go test ./topo -update and review the diff", path)
	}
}

func TestWriteText(t *testing.T) {
	for _, tc := range renderCases {
		t.Run(tc.name, func(t *testing.T) {
			m := build(t, tc.snap())
			var buf bytes.Buffer
			if err := WriteText(&buf, m); err != nil {
				t.Fatal(err)
			}
			out := buf.String()
			if !strings.Contains(out, "GB/s (uni)") || !strings.Contains(out, "GB/s (bidi)") {
				t.Errorf("text has no labelled bandwidth:\n%s", out)
			}
			assertQualified(t, tc.name, out)
			for _, d := range m.Devices {
				if !strings.Contains(out, d.Name) {
					t.Errorf("text does not name %s", d.Name)
				}
			}
			for _, w := range []string{"CPU Affinity", "NUMA Affinity", "Legend:", "SYS  = "} {
				if !strings.Contains(out, w) {
					t.Errorf("text lacks %q", w)
				}
			}
			golden(t, tc.name+".txt", buf.Bytes())
		})
	}
}

func TestWriteTextHGXRows(t *testing.T) {
	m := build(t, hgxH100())
	var buf bytes.Buffer
	if err := WriteText(&buf, m); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, re := range []string{
		`(?m)^GPU0 +X +NV18 +NV18 .* PIX .* 0-55,112-167 +0$`,
		`(?m)^  GPU0-GPU1 +NV18 +450 GB/s \(uni\) +900 GB/s \(bidi\) +18 x NVLink4 at 25 GB/s \(uni\) per link`,
		`(?m)^  GPU3-NVME3 +PIX +7.88 GB/s \(uni\) +15.75 GB/s \(bidi\) +PCIe Gen4 x4`,
		`(?m)^  NIC4 +0000:9c:00.0 +mlx5_4 +Mellanox ConnectX-7$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("text does not match %s:\n%s", re, out)
		}
	}
	if strings.Contains(out, " \n") {
		t.Error("text has trailing spaces")
	}
}

func TestWriteSVG(t *testing.T) {
	for _, tc := range renderCases {
		t.Run(tc.name, func(t *testing.T) {
			m := build(t, tc.snap())
			var buf bytes.Buffer
			if err := WriteSVG(&buf, m); err != nil {
				t.Fatal(err)
			}
			out := buf.String()
			dec := xml.NewDecoder(strings.NewReader(out))
			root, lines, texts := "", 0, 0
			for {
				tok, err := dec.Token()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatalf("SVG is not well-formed XML: %v\n%s", err, out)
				}
				if se, ok := tok.(xml.StartElement); ok {
					if root == "" {
						root = se.Name.Local
					}
					switch se.Name.Local {
					case "line":
						lines++
					case "text":
						texts++
					}
				}
			}
			if root != "svg" {
				t.Errorf("root element %q, want svg", root)
			}
			for _, d := range m.Devices {
				if !strings.Contains(out, ">"+d.Name+"<") {
					t.Errorf("SVG does not draw %s", d.Name)
				}
			}
			assertQualified(t, tc.name, out)
			golden(t, tc.name+".svg", buf.Bytes())
		})
	}
	// The HGX board: 28 NVLink edges, 16 NIC/NVMe edges, 5 legend lines.
	m := build(t, hgxH100())
	var buf bytes.Buffer
	if err := WriteSVG(&buf, m); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(buf.String(), `stroke="#76b900" stroke-width=`) - 1; got != 28 {
		t.Errorf("%d NVLink edges, want 28", got)
	}
	if !strings.Contains(buf.String(), "NV18: 28 pairs, 450 GB/s (uni) / 900 GB/s (bidi)") {
		t.Error("SVG legend lacks the NV18 summary")
	}
	if !strings.Contains(buf.String(), "NUMA 1") {
		t.Error("SVG does not group by NUMA node")
	}
}

var dotEdge = regexp.MustCompile(`(?m)^  "([A-Z]+[0-9]+)" -- "([A-Z]+[0-9]+)" \[label="([^"\\]+)\\n([^"]+)"`)

func TestWriteDOT(t *testing.T) {
	for _, tc := range renderCases {
		t.Run(tc.name, func(t *testing.T) {
			m := build(t, tc.snap())
			var buf bytes.Buffer
			if err := WriteDOT(&buf, m); err != nil {
				t.Fatal(err)
			}
			out := buf.String()
			edges := dotEdge.FindAllStringSubmatch(out, -1)
			pairs := gpuPairs(m)
			if len(edges) != len(pairs) {
				t.Fatalf("%d edges, want %d (every pair with a GPU)\n%s", len(edges), len(pairs), out)
			}
			seen := map[string]bool{}
			for _, e := range edges {
				c, ok := m.Cell(e[1], e[2])
				if !ok {
					t.Errorf("edge between unknown devices %s and %s", e[1], e[2])
					continue
				}
				seen[e[1]+"-"+e[2]] = true
				if e[3] != c.Class {
					t.Errorf("edge %s-%s labelled %q, want %q", e[1], e[2], e[3], c.Class)
				}
				if c.Kind == LinkNVLink && !strings.Contains(e[0], "") {
					t.Errorf("edge %s-%s", e[1], e[2])
				}
			}
			for _, p := range pairs {
				if k := m.Devices[p[0]].Name + "-" + m.Devices[p[1]].Name; !seen[k] {
					t.Errorf("no edge for %s", k)
				}
			}
			if strings.Count(out, "{") != strings.Count(out, "}") {
				t.Error("unbalanced braces")
			}
			assertQualified(t, tc.name, out)
			golden(t, tc.name+".dot", buf.Bytes())
		})
	}
	m := build(t, hgxH100())
	var buf bytes.Buffer
	_ = WriteDOT(&buf, m)
	if !strings.Contains(buf.String(), `"GPU0" -- "GPU1" [label="NV18\n450 GB/s (uni) / 900 GB/s (bidi)", color="#76b900", penwidth=4]`) {
		t.Errorf("NVLink edge not drawn thick with its bandwidth:\n%s", buf.String())
	}
	if !strings.Contains(buf.String(), "subgraph cluster_numa1") {
		t.Error("no NUMA cluster")
	}
}

func TestJSON(t *testing.T) {
	m := build(t, twoSwitches())
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	for _, w := range []string{`"devices":`, `"cells":`, `"numa_node":1`, `"cpu_affinity":"32-63"`, `"gbps_uni":`, `"gbps_bidi":`, `"bottleneck":"0000:84:00.0"`, `"class":"PXB"`} {
		if !strings.Contains(out, w) {
			t.Errorf("JSON lacks %s", w)
		}
	}
	var back Matrix
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Cells[1][2] != m.Cells[1][2] {
		t.Errorf("JSON round trip changed a cell: %+v vs %+v", back.Cells[1][2], m.Cells[1][2])
	}
}
