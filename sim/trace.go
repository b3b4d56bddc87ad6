// Package sim replays GPU cluster traces against placement policies: the
// experiment of Weng et al. (USENIX ATC '23) on Alibaba's
// cluster-trace-gpu-v2023 ("openb"), with the paper's baselines, FGD and
// kiln's own policy side by side, plus a replay with arrival and departure
// times.
package sim

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"kiln.dev/kiln/sched/frag"
)

// NodeFile is the node list the paper's cluster is made of: the GPU nodes.
const NodeFile = "openb_node_list_gpu_node.csv"

// maxNodeGPUs bounds the GPU count of a node read from a trace.
const maxNodeGPUs = 64

// Node is one node of a trace's node list.
type Node struct {
	Name   string
	CPU    int64 // milli-cores
	Memory int64 // MiB
	GPUs   int
	Model  string // GPU model, "" when the node has no GPU
}

// Pod is one task of a trace's pod list.
type Pod struct {
	Name string
	frag.Task
	QoS   string
	Phase string
	// Created, Deleted and Scheduled are seconds from the trace origin;
	// -1 when the trace does not say.
	Created, Deleted, Scheduled int64
}

// Trace is a cluster and a task list.
type Trace struct {
	Name  string // e.g. "default" for openb_pod_list_default.csv
	Nodes []Node
	Pods  []Pod
}

// PodFile is the file name of the pod list called name ("default",
// "gpushare40", ...).
func PodFile(name string) string { return "openb_pod_list_" + name + ".csv" }

// LoadTrace reads the GPU node list and the pod list called pods (e.g.
// "default") from dir.
func LoadTrace(dir, pods string) (*Trace, error) {
	nodes, err := readFile(filepath.Join(dir, NodeFile), ReadNodes)
	if err != nil {
		return nil, err
	}
	ps, err := readFile(filepath.Join(dir, PodFile(pods)), ReadPods)
	if err != nil {
		return nil, err
	}
	return &Trace{Name: pods, Nodes: nodes, Pods: ps}, nil
}

// Variants lists the pod lists in dir by name ("cpu050", "default", ...).
func Variants(dir string) ([]string, error) {
	m, err := filepath.Glob(filepath.Join(dir, "openb_pod_list_*.csv"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range m {
		b := filepath.Base(f)
		out = append(out, strings.TrimSuffix(strings.TrimPrefix(b, "openb_pod_list_"), ".csv"))
	}
	return out, nil
}

func readFile[T any](path string, read func(io.Reader) ([]T, error)) ([]T, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	v, err := read(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return v, nil
}

// table reads a CSV with a header and finds the named columns.
type table struct {
	r    *csv.Reader
	cols map[string]int
	line int
}

func newTable(r io.Reader, required ...string) (*table, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	head, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, errors.New("empty file: want a CSV header line")
	}
	if err != nil {
		return nil, fmt.Errorf("line 1: %w", err)
	}
	t := &table{r: cr, cols: map[string]int{}, line: 1}
	for i, h := range head {
		t.cols[strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))] = i
	}
	var missing []string
	for _, c := range required {
		if _, ok := t.cols[c]; !ok {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("line 1: header %q lacks column(s) %s", strings.Join(head, ","), strings.Join(missing, ", "))
	}
	return t, nil
}

// next returns the next record, or nil at the end.
func (t *table) next() ([]string, error) {
	rec, err := t.r.Read()
	if errors.Is(err, io.EOF) {
		return nil, nil
	}
	t.line++
	if err != nil {
		var pe *csv.ParseError
		if errors.As(err, &pe) {
			t.line = pe.Line
			return nil, fmt.Errorf("line %d: %w", pe.Line, pe.Err)
		}
		return nil, fmt.Errorf("line %d: %w", t.line, err)
	}
	return rec, nil
}

func (t *table) str(rec []string, col string) string {
	i, ok := t.cols[col]
	if !ok || i >= len(rec) {
		return ""
	}
	return strings.TrimSpace(rec[i])
}

// num reads a non-negative integer column; empty reads as def.
func (t *table) num(rec []string, col string, def int64, max int64) (int64, error) {
	s := t.str(rec, col)
	if s == "" {
		if def < 0 && def != -1 {
			return 0, fmt.Errorf("line %d: column %s is empty", t.line, col)
		}
		return def, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		// Some exports write integers as floats ("1000.0").
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || f != float64(int64(f)) {
			return 0, fmt.Errorf("line %d: cannot read %q in column %s as a whole number", t.line, s, col)
		}
		v = int64(f)
	}
	if v < 0 || v > max {
		return 0, fmt.Errorf("line %d: column %s is %d, want 0..%d", t.line, col, v, max)
	}
	return v, nil
}

// required marks a column that may not be empty.
const required = -2

// ReadNodes reads a node list (sn,cpu_milli,memory_mib,gpu,model).
func ReadNodes(r io.Reader) ([]Node, error) {
	t, err := newTable(r, "sn", "cpu_milli", "memory_mib", "gpu")
	if err != nil {
		return nil, err
	}
	var out []Node
	for {
		rec, err := t.next()
		if err != nil {
			return nil, err
		}
		if rec == nil {
			break
		}
		n := Node{Name: t.str(rec, "sn"), Model: t.str(rec, "model")}
		if n.CPU, err = t.num(rec, "cpu_milli", required, 1<<40); err != nil {
			return nil, err
		}
		if n.Memory, err = t.num(rec, "memory_mib", required, 1<<40); err != nil {
			return nil, err
		}
		g, err := t.num(rec, "gpu", required, maxNodeGPUs)
		if err != nil {
			return nil, err
		}
		n.GPUs = int(g)
		if n.GPUs == 0 {
			n.Model = ""
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("no nodes: the file has a header but no rows")
	}
	return out, nil
}

// ReadPods reads a pod list (name,cpu_milli,memory_mib,num_gpu,gpu_milli and
// optionally gpu_spec,qos,pod_phase,creation_time,deletion_time,
// scheduled_time).
func ReadPods(r io.Reader) ([]Pod, error) {
	t, err := newTable(r, "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
	if err != nil {
		return nil, err
	}
	var out []Pod
	for {
		rec, err := t.next()
		if err != nil {
			return nil, err
		}
		if rec == nil {
			break
		}
		p := Pod{Name: t.str(rec, "name"), QoS: t.str(rec, "qos"), Phase: t.str(rec, "pod_phase")}
		if p.CPU, err = t.num(rec, "cpu_milli", required, 1<<40); err != nil {
			return nil, err
		}
		if p.Memory, err = t.num(rec, "memory_mib", required, 1<<40); err != nil {
			return nil, err
		}
		g, err := t.num(rec, "num_gpu", required, maxNodeGPUs)
		if err != nil {
			return nil, err
		}
		m, err := t.num(rec, "gpu_milli", 0, frag.MilliPerGPU)
		if err != nil {
			return nil, err
		}
		p.GPUs, p.GPUMilli = int(g), int32(m)
		switch {
		case p.GPUs == 0:
			p.GPUMilli = 0
		case p.GPUMilli == 0:
			return nil, fmt.Errorf("line %d: task %s asks for %d GPU(s) with gpu_milli 0", t.line, p.Name, p.GPUs)
		case p.GPUs > 1 && p.GPUMilli < frag.MilliPerGPU:
			return nil, fmt.Errorf("line %d: task %s asks for %d GPUs of %d milli each: only single-GPU tasks may share a GPU", t.line, p.Name, p.GPUs, p.GPUMilli)
		}
		if spec := t.str(rec, "gpu_spec"); spec != "" && p.GPUs > 0 {
			for _, s := range strings.Split(spec, "|") {
				if s = strings.TrimSpace(s); s != "" {
					p.Models = append(p.Models, s)
				}
			}
		}
		for _, c := range []struct {
			col string
			dst *int64
		}{{"creation_time", &p.Created}, {"deletion_time", &p.Deleted}, {"scheduled_time", &p.Scheduled}} {
			if *c.dst, err = t.num(rec, c.col, -1, 1<<50); err != nil {
				return nil, err
			}
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, errors.New("no tasks: the file has a header but no rows")
	}
	return out, nil
}
