package prom_test

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"kiln.dev/kiln/doctor"
	"kiln.dev/kiln/gpumetrics"
	"kiln.dev/kiln/gpumetrics/prom"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/source"
)

var update = flag.Bool("update", false, "rewrite the golden exposition files in testdata")

// machines are recorded machines, each with its golden exposition file.
var machines = []struct{ name, capture string }{
	{"hgx-h100", "../../testdata/captures/nvidia-smi-q/h100x8-535.161.08-hw-power-brake.txt"},
	{"a100-mig", "../../testdata/captures/nvidia-smi-q-xml/a100-sxm4-80gb-mig-535.54.03.xml"},
	{"mi300x-cpx", "../../testdata/captures/rocm-smi/mi300x-cpx-partitions-concise.txt"},
}

// sample reads a recorded machine as the agent would sample it.
func sample(t testing.TB, path string) gpumetrics.Input {
	t.Helper()
	s, err := source.OneMachine(context.Background(), []string{path})
	if err != nil {
		t.Fatal(err)
	}
	k := kb.Default()
	k.Annotate(s)
	rep, err := doctor.Run(context.Background(), s, k)
	if err != nil {
		t.Fatal(err)
	}
	var finds []gpumetrics.Finding
	for _, f := range rep.Findings {
		finds = append(finds, gpumetrics.Finding{Check: f.ID, Severity: f.Severity.String(), Devices: f.Devices})
	}
	return gpumetrics.Input{Snapshot: s, Findings: finds, Hostname: "node-1"}
}

func exposition(t testing.TB, c prometheus.Collector) []byte {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "kiln_agent_sample_") {
			continue // the time of the sample
		}
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func TestGoldenExposition(t *testing.T) {
	for _, m := range machines {
		t.Run(m.name, func(t *testing.T) {
			c := prom.New()
			if err := c.Set(gpumetrics.Families(sample(t, m.capture), gpumetrics.Options{DCGM: true}), time.Unix(0, 0), 0); err != nil {
				t.Fatal(err)
			}
			got := exposition(t, c)
			golden := filepath.Join("testdata", m.name+".prom")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (go test ./gpumetrics/prom -update writes it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("the exposition of %s differs from %s (go test ./gpumetrics/prom -update rewrites it after a deliberate change):\n%s", m.capture, golden, firstDiff(string(want), string(got)))
			}
		})
	}
}

func firstDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var a, b string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if a != b {
			return "line " + strconv.Itoa(i+1) + ":\n  want " + a + "\n  got  " + b
		}
	}
	return ""
}

// TestLint holds kiln's families to Prometheus' naming rules (promlint),
// on every recorded machine.
func TestLint(t *testing.T) {
	for _, m := range machines {
		c := prom.New()
		if err := c.Set(gpumetrics.Families(sample(t, m.capture), gpumetrics.Options{}), time.Now(), time.Millisecond); err != nil {
			t.Fatal(err)
		}
		problems, err := testutil.CollectAndLint(c)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("%s: %s: %s", m.name, p.Metric, p.Text)
		}
	}
}
