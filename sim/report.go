package sim

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// Summary is one policy's result over all seeds.
type Summary struct {
	Trace  string `json:"trace"`
	Policy string `json:"policy"`
	// Alloc100Mean and Alloc130Mean are the mean GPU allocation rate
	// (allocated over total milli-GPU, percent) when the arrived workload
	// is 100% and 130% of the cluster's GPU capacity; the SDs are the
	// sample standard deviations over seeds.
	Alloc100Mean float64 `json:"alloc_100_mean"`
	Alloc100SD   float64 `json:"alloc_100_sd"`
	Alloc130Mean float64 `json:"alloc_130_mean"`
	Alloc130SD   float64 `json:"alloc_130_sd"`
	// FailedMean is the mean number of tasks that fit nowhere.
	FailedMean float64 `json:"failed_mean"`
	Seeds      int     `json:"seeds"`
	// Curve is the mean of the runs' curves.
	Curve []Point `json:"-"`
}

// Row is one line of the machine-readable output: a Summary.
type Row = Summary

// Rows are the experiment's summaries with the trace named.
func (e *Experiment) Rows() []Row {
	out := make([]Row, len(e.Summary))
	for i, s := range e.Summary {
		s.Trace = e.Trace
		out[i] = s
	}
	return out
}

func summarize(name string, runs []Run) Summary {
	s := Summary{Policy: name, Seeds: len(runs)}
	var a100, a130 []float64
	for _, r := range runs {
		a100 = append(a100, r.Alloc100)
		a130 = append(a130, r.Alloc130)
		s.FailedMean += float64(r.Failed) / float64(len(runs))
	}
	s.Alloc100Mean, s.Alloc100SD = meanSD(a100)
	s.Alloc130Mean, s.Alloc130SD = meanSD(a130)
	s.Curve = meanCurve(runs)
	return s
}

func meanSD(v []float64) (float64, float64) {
	if len(v) == 0 {
		return math.NaN(), math.NaN()
	}
	var sum float64
	for _, x := range v {
		sum += x
	}
	m := sum / float64(len(v))
	if len(v) < 2 {
		return m, 0
	}
	var ss float64
	for _, x := range v {
		ss += (x - m) * (x - m)
	}
	return m, math.Sqrt(ss / float64(len(v)-1))
}

func meanCurve(runs []Run) []Point {
	byX := map[int]*Point{}
	var xs []int
	for _, r := range runs {
		for _, p := range r.Curve {
			q, ok := byX[p.Arrived]
			if !ok {
				q = &Point{Arrived: p.Arrived}
				byX[p.Arrived] = q
				xs = append(xs, p.Arrived)
			}
			q.Alloc += p.Alloc
			q.Frag += p.Frag
			q.Unallocated += p.Unallocated
			q.Samples++
		}
	}
	out := make([]Point, 0, len(xs))
	for x := 0; len(out) < len(xs); x++ {
		q, ok := byX[x]
		if !ok {
			continue
		}
		n := float64(q.Samples)
		out = append(out, Point{Arrived: x, Alloc: q.Alloc / n, Frag: q.Frag / n, Unallocated: q.Unallocated / n, Samples: q.Samples})
	}
	return out
}

// WriteTable writes the summary as a text table.
func (e *Experiment) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "trace %s: %d nodes, %d GPUs, %d tasks, target workload of %d shapes, seeds %s\n\n",
		e.Trace, e.Nodes, e.GPUs, e.Tasks, e.Target, seedList(e.Seeds))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\talloc@100% (sd)\talloc@130% (sd)\tunallocated@130%\tfailed tasks\t")
	for _, s := range e.Summary {
		fmt.Fprintf(tw, "%s\t%.2f%% (%.2f)\t%.2f%% (%.2f)\t%.2f%%\t%.0f\t\n", s.Policy, s.Alloc100Mean, s.Alloc100SD, s.Alloc130Mean, s.Alloc130SD, 100-s.Alloc130Mean, s.FailedMean)
	}
	return tw.Flush()
}

// WriteCSV writes every policy's mean curve: allocation rate,
// fragmentation rate and unallocated GPUs against arrived workload.
// header says whether to write the header line first.
func (e *Experiment) WriteCSV(w io.Writer, header bool) error {
	if header {
		if _, err := fmt.Fprintln(w, "trace,policy,arrived_pct,alloc_pct,frag_pct,unallocated_gpus"); err != nil {
			return err
		}
	}
	for _, s := range e.Summary {
		for _, p := range s.Curve {
			if _, err := fmt.Fprintf(w, "%s,%s,%d,%.4f,%.4f,%.3f\n", e.Trace, s.Policy, p.Arrived, p.Alloc, p.Frag, p.Unallocated); err != nil {
				return err
			}
		}
	}
	return nil
}

func seedList(seeds []int64) string {
	if len(seeds) == 0 {
		return "none"
	}
	contiguous := true
	for i := 1; i < len(seeds); i++ {
		if seeds[i] != seeds[i-1]+1 {
			contiguous = false
		}
	}
	if contiguous && len(seeds) > 2 {
		return fmt.Sprintf("%d-%d", seeds[0], seeds[len(seeds)-1])
	}
	parts := make([]string, len(seeds))
	for i, s := range seeds {
		parts[i] = fmt.Sprint(s)
	}
	return strings.Join(parts, ",")
}
