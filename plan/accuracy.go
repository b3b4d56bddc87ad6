package plan

import (
	_ "embed"
	"fmt"
	"math"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"kiln.dev/kiln/kb"
)

//go:embed data/published.yaml
var publishedYAML []byte

// Published is one measurement from a paper or vendor report.
type Published struct {
	ID          string   `json:"id"`
	Cite        string   `json:"cite"`
	Config      string   `json:"config"`
	Model       *Model   `json:"model,omitempty"`
	ModelName   string   `json:"model_name,omitempty"`
	Mode        string   `json:"mode,omitempty"`
	GPU         string   `json:"gpu,omitempty"`
	GPUs        int      `json:"gpus,omitempty"`
	GPUsPerNode int      `json:"gpus_per_node,omitempty"`
	NetworkGbps float64  `json:"network_gbps,omitempty"`
	GlobalBatch int      `json:"global_batch,omitempty"`
	Seq         int      `json:"seq,omitempty"`
	Gen         int      `json:"gen,omitempty"`
	Precision   string   `json:"precision,omitempty"`
	NoFlash     bool     `json:"no_flash_attention,omitempty"`
	Layout      string   `json:"layout,omitempty"`
	Free        []string `json:"free,omitempty"`
	// ZeRO-paper rows: parameters, data-parallel degree and stage.
	Params float64 `json:"params,omitempty"`
	ND     int     `json:"nd,omitempty"`
	Zero   int     `json:"zero,omitempty"`
	// Tokens for KV cache rows.
	Tokens   int                `json:"tokens,omitempty"`
	Measured map[string]float64 `json:"measured"`
}

// AccuracyRow compares one published figure with kiln's prediction.
type AccuracyRow struct {
	ID     string `json:"id"`
	Cite   string `json:"cite"`
	Config string `json:"config"`
	// Kind is throughput or memory.
	Kind      string  `json:"kind"`
	Metric    string  `json:"metric"`
	Published float64 `json:"published"`
	Predicted float64 `json:"predicted"`
	// Error is predicted/published - 1.
	Error float64 `json:"error"`
	// Layout is the layout kiln evaluated (free keys filled in).
	Layout string `json:"layout,omitempty"`
	Note   string `json:"note,omitempty"`
}

// PublishedRows returns the embedded measurements.
func PublishedRows() ([]Published, error) {
	var doc struct {
		Rows []Published `json:"rows"`
	}
	if err := yaml.Unmarshal(publishedYAML, &doc); err != nil {
		return nil, fmt.Errorf("plan: published.yaml: %w", err)
	}
	for _, r := range doc.Rows {
		if r.ID == "" || r.Cite == "" || r.Config == "" || len(r.Measured) != 1 {
			return nil, fmt.Errorf("plan: published.yaml: row %q needs id, cite, config and one measured figure", r.ID)
		}
	}
	return doc.Rows, nil
}

// Accuracy evaluates every published row.
func Accuracy(k *kb.KB) ([]AccuracyRow, error) {
	rows, err := PublishedRows()
	if err != nil {
		return nil, err
	}
	out := make([]AccuracyRow, 0, len(rows))
	for _, r := range rows {
		a, err := r.evaluate(k)
		if err != nil {
			return nil, fmt.Errorf("plan: published row %s: %w", r.ID, err)
		}
		out = append(out, a)
	}
	return out, nil
}

func (r Published) model() (Model, error) {
	if r.Model != nil {
		m := *r.Model
		if m.Source == "" {
			m.Source = r.Cite
		}
		return m, m.Validate()
	}
	m, ok := ModelByName(r.ModelName)
	if !ok {
		return Model{}, fmt.Errorf("no model %q in the catalog", r.ModelName)
	}
	return m, nil
}

func (r Published) evaluate(k *kb.KB) (AccuracyRow, error) {
	var metric string
	var published float64
	for m, v := range r.Measured {
		metric, published = m, v
	}
	a := AccuracyRow{ID: r.ID, Cite: r.Cite, Config: r.Config, Metric: metric, Published: published}
	switch metric {
	case "model_state_bytes":
		a.Kind = "memory"
		j := Job{Precision: "bf16", Optimizer: OptAdamW}
		a.Predicted = ModelStateBytes(r.Params, j.OptimizerBytes(), r.ND, r.Zero)
	case "weights_bytes", "kv_cache_bytes":
		a.Kind = "memory"
		m, err := r.model()
		if err != nil {
			return a, err
		}
		j := Job{Model: m, Mode: ModeInfer, Precision: r.Precision}
		if metric == "weights_bytes" {
			a.Predicted = m.Params() * j.inferenceWeightBytes()
		} else {
			a.Predicted = m.KVCacheBytes(r.Tokens, j.inferenceWeightBytes())
		}
	default:
		a.Kind = "throughput"
		e, err := r.run(k)
		if err != nil {
			return a, err
		}
		a.Layout = e.LayoutString
		if !e.Fits {
			a.Note = fmt.Sprintf("kiln's memory model puts this layout at %s, over the GPU's %s", gbString(e.MemoryPerGPUBytes), gbString(e.MemoryCapacityBytes))
		}
		switch metric {
		case "hardware_tflops_per_gpu":
			a.Predicted = e.HardwareTFLOPSPerGPU
		case "tflops_per_gpu":
			a.Predicted = e.TFLOPSPerGPU
		case "mfu":
			a.Predicted = e.MFU
		case "tokens_per_s":
			a.Predicted = e.TokensPerS
		default:
			return a, fmt.Errorf("unknown measured kind %q", metric)
		}
	}
	a.Error = a.Predicted/a.Published - 1
	return a, nil
}

// run evaluates the row's published layout, filling the keys the authors
// did not publish with the fastest choice that fits.
func (r Published) run(k *kb.KB) (Estimate, error) {
	m, err := r.model()
	if err != nil {
		return Estimate{}, err
	}
	perNode := r.GPUsPerNode
	if perNode == 0 {
		perNode = min(8, r.GPUs)
	}
	c, err := CatalogCluster(r.GPU, r.GPUs, perNode, r.NetworkGbps, k)
	if err != nil {
		return Estimate{}, err
	}
	mode := r.Mode
	if mode == "" {
		mode = ModeTrain
	}
	j, err := Job{Model: m, Mode: mode, Precision: r.Precision, GlobalBatch: r.GlobalBatch, Seq: r.Seq, GenTokens: r.Gen, NoFlashAttention: r.NoFlash}.Normalize()
	if err != nil {
		return Estimate{}, err
	}
	fixed, err := ParseLayout(r.Layout)
	if err != nil {
		return Estimate{}, err
	}
	given := map[string]bool{}
	for _, p := range strings.Split(r.Layout, ",") {
		key, _, _ := strings.Cut(strings.TrimSpace(p), "=")
		given[key] = !slices.Contains(r.Free, key)
	}
	var best, bestAny *Estimate
	for _, l := range Candidates(j, c) {
		if l.DP != fixed.DP || l.TP != fixed.TP || l.PP != fixed.PP ||
			(given["zero"] && (l.Zero != fixed.Zero || l.Hybrid != fixed.Hybrid)) ||
			(given["mb"] && l.MicroBatch != fixed.MicroBatch) ||
			(given["recompute"] && l.Recompute != fixed.Recompute) ||
			(given["vp"] && l.VP != fixed.VP) ||
			(!slices.Contains(r.Free, "vp") && l.VP > 1) ||
			(!slices.Contains(r.Free, "mb") && !given["mb"] && l.MicroBatch != 1) {
			continue
		}
		var e Estimate
		if mode == ModeInfer {
			e = evalInfer(j, c, l)
		} else {
			e = evalTrain(j, c, l)
		}
		if bestAny == nil || e.TokensPerS > bestAny.TokensPerS {
			bestAny = &e
		}
		if e.Fits && (best == nil || e.TokensPerS > best.TokensPerS) {
			best = &e
		}
	}
	if best == nil {
		best = bestAny
	}
	if best == nil {
		return Estimate{}, fmt.Errorf("layout %s is not one kiln can evaluate on %d GPUs", r.Layout, r.GPUs)
	}
	return *best, nil
}

// MedianAbsError is the median of |error| over rows of a kind.
func MedianAbsError(rows []AccuracyRow, kind string) float64 {
	var errs []float64
	for _, r := range rows {
		if r.Kind == kind {
			errs = append(errs, math.Abs(r.Error))
		}
	}
	if len(errs) == 0 {
		return math.NaN()
	}
	slices.Sort(errs)
	n := len(errs)
	if n%2 == 1 {
		return errs[n/2]
	}
	return (errs[n/2-1] + errs[n/2]) / 2
}
