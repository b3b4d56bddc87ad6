package serving

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"kiln.dev/kiln/compat"
	"kiln.dev/kiln/compat/require"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/plan"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/topo"
	"kiln.dev/kiln/units"
)

// Model is what kiln read of a model to serve.
type Model struct {
	Name string
	// Format is FormatSafetensors or FormatGGUF.
	Format string
	// Arch is the model's shape, from its config.json or a GGUF header
	// (GGUF.Model); a GGUF file without it is sized by its weights alone.
	Arch *plan.Model
	// Precision is the weights' (bf16, fp16, fp32, fp8), from the config's
	// torch_dtype; "" is bf16.
	Precision string
	// WeightsBytes is the size of its weight files.
	WeightsBytes int64
	// Path is where it lies on the nodes (its folder, or its one GGUF
	// file), absolute; "" for a model of the lab's registry, which the node
	// pulls (and mounts into an engine's container). File is its one
	// weights file, for a GGUF model. Engine images cannot see a Path.
	Path, File string
}

// Request is what the user asks of a deployment; zero values are chosen.
type Request struct {
	// Engine names the engine; "" lets kiln choose.
	Engine string
	// Context is the tokens per sequence (prompt and answer); 0 is the
	// model's own context, at most DefaultContext.
	Context int
	// Batch is the sequences served at once; 0 is DefaultBatch.
	Batch int
	// GPUs fixes the tensor-parallel degree; 0 sizes it.
	GPUs int
	// Custom, when set, is the only engine considered (CustomEngine): the
	// user's image or a command run on the node.
	Custom *Engine
	// Process runs the engine's command on the node, where the user has
	// installed it, instead of in one of its images.
	Process bool
}

// Defaults of a Request.
const (
	DefaultContext = 8192
	DefaultBatch   = 8
)

// Node is a node to serve on.
type Node struct {
	Name     string
	Snapshot *snapshot.Snapshot
}

// Choice is one way to serve the model.
type Choice struct {
	Engine string `json:"engine"`
	Image  string `json:"image"`
	Node   string `json:"node"`
	// GPUs is the tensor-parallel degree; Island the GPU indexes of the
	// NVLink or xGMI island (or single GPU) that holds them.
	GPUs   int    `json:"gpus"`
	Island []int  `json:"island"`
	Link   string `json:"link"`
	// Verdict is kiln compat's for the image on the node; VerdictFrom says
	// whether kiln read the image or went by the catalogue's CUDA or ROCm
	// line.
	Verdict     compat.Verdict `json:"verdict"`
	VerdictFrom string         `json:"verdict_from"`
	// MemoryPerGPUBytes is plan's estimate of one GPU's memory (weights, KV
	// cache, working set) against CapacityBytes.
	MemoryPerGPUBytes float64  `json:"memory_per_gpu_bytes"`
	CapacityBytes     float64  `json:"capacity_bytes"`
	Context           int      `json:"context"`
	Batch             int      `json:"batch"`
	Notes             []string `json:"notes,omitempty"`
}

// Outcome is the best choice, the others that would also serve, and why
// every other engine, image and node was left out.
type Outcome struct {
	Best    Choice   `json:"best"`
	Others  []Choice `json:"others,omitempty"`
	Skipped []string `json:"skipped,omitempty"`
}

// Refusal says that nothing serves the model, and why on each node.
type Refusal struct {
	Model   string
	Reasons []string
}

func (r *Refusal) Error() string {
	return fmt.Sprintf("no engine, image and node of the fleet can serve %s:\n  - %s", r.Model, strings.Join(r.Reasons, "\n  - "))
}

// ImageReader gives what kiln compat read of an image before (its cache);
// nil when it has not read it.
type ImageReader func(ref string) *compat.Requirements

// Choose picks the engine, image, node and tensor-parallel degree that
// serve the model: engines that serve its format, their images for the
// node's GPU vendor that kiln compat does not find failing there, the
// fewest GPUs of one NVLink or xGMI island whose memory holds the weights,
// the KV cache of Batch sequences of Context tokens and the working set.
// Images kiln compat read decide by what was read; the others by the
// catalogue's CUDA or ROCm line. An image whose verdict is unknown ranks
// after every one that runs, and says so.
func Choose(m Model, req Request, nodes []Node, cat *Catalogue, k *kb.KB, read ImageReader) (*Outcome, error) {
	if k == nil {
		k = kb.Default()
	}
	if cat == nil {
		return nil, errors.New("no engine catalogue")
	}
	if m.Format != FormatSafetensors && m.Format != FormatGGUF {
		return nil, fmt.Errorf("model %s: format %q; kiln serve reads safetensors (with config.json) or GGUF", m.Name, m.Format)
	}
	if m.Format == FormatSafetensors && m.Arch == nil {
		return nil, fmt.Errorf("model %s: safetensors weights without a config.json: kiln cannot size it", m.Name)
	}
	if req.Engine != "" && req.Custom == nil {
		if _, ok := cat.Engine(req.Engine); !ok {
			return nil, fmt.Errorf("engine %q is not in kiln's catalogue (%s)", req.Engine, strings.Join(engineNames(cat), ", "))
		}
	}
	if req.Batch < 0 || req.Context < 0 || req.GPUs < 0 {
		return nil, errors.New("the context, batch and GPU count cannot be negative")
	}
	if req.Batch == 0 {
		req.Batch = DefaultBatch
	}
	if req.Context == 0 {
		req.Context = DefaultContext
		if m.Arch != nil && m.Arch.Seq > 0 {
			req.Context = min(max(m.Arch.Seq, m.Arch.MaxSeq), DefaultContext)
		}
	}
	var engines []Engine
	all := cat.Engines
	if req.Custom != nil {
		all, req.Engine = []Engine{*req.Custom}, req.Custom.Name
	}
	for _, e := range all {
		switch {
		case req.Engine != "" && e.Name != req.Engine:
		case !slices.Contains(e.Formats, m.Format):
			if req.Engine != "" {
				return nil, fmt.Errorf("engine %s serves %s, not %s", e.Name, strings.Join(e.Formats, " and "), m.Format)
			}
		default:
			engines = append(engines, e)
		}
	}
	if len(engines) == 0 {
		return nil, fmt.Errorf("no engine in kiln's catalogue serves %s models", m.Format)
	}
	var out Outcome
	var found []Choice
	var reasons []string
	sorted := append([]Node(nil), nodes...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	for _, n := range sorted {
		cs, why := chooseOnNode(m, req, n, engines, k, read)
		found = append(found, cs...)
		out.Skipped = append(out.Skipped, why...)
		if len(cs) == 0 {
			reasons = append(reasons, why...)
		}
	}
	if len(found) == 0 {
		if len(reasons) == 0 {
			reasons = []string{"the fleet has no node"}
		}
		return nil, &Refusal{Model: m.Name, Reasons: reasons}
	}
	order := map[string]int{}
	for i, e := range cat.Engines {
		order[e.Name] = i
	}
	sort.SliceStable(found, func(i, j int) bool {
		a, b := found[i], found[j]
		if ra, rb := verdictRank(a.Verdict), verdictRank(b.Verdict); ra != rb {
			return ra < rb
		}
		if a.GPUs != b.GPUs {
			return a.GPUs < b.GPUs
		}
		if order[a.Engine] != order[b.Engine] {
			return order[a.Engine] < order[b.Engine]
		}
		return a.Node < b.Node
	})
	out.Best, out.Others = found[0], found[1:]
	return &out, nil
}

// chooseOnNode gives the ways to serve on one node, each engine's first
// image that is not refused, and why the others were left out.
func chooseOnNode(m Model, req Request, n Node, engines []Engine, k *kb.KB, read ImageReader) ([]Choice, []string) {
	s := n.Snapshot
	if s == nil || len(s.GPUs) == 0 {
		return nil, []string{fmt.Sprintf("%s: no GPU", n.Name)}
	}
	vendor := s.GPUs[0].Vendor
	for _, g := range s.GPUs {
		if g.Vendor != vendor {
			return nil, []string{fmt.Sprintf("%s: it mixes GPU vendors; kiln serve keeps a deployment to one", n.Name)}
		}
	}
	islands, link, err := islandsOf(s, k)
	if err != nil {
		return nil, []string{fmt.Sprintf("%s: its topology cannot be read: %v", n.Name, err)}
	}
	var out []Choice
	var why []string
	for _, e := range engines {
		size, fitWhy := sizeOn(m, req, e, s, islands, k)
		if req.Process || len(e.Images) == 0 {
			// A command on the node: no image for compat to read.
			if size.gpus == 0 {
				why = append(why, fmt.Sprintf("%s: %s: %s", n.Name, e.Name, fitWhy))
				continue
			}
			c := choiceOf(e, n.Name, "", size, link, req)
			c.Verdict, c.VerdictFrom = compat.Unknown, "a process on the node"
			c.Notes = append(c.Notes, "the engine runs as a process on the node: kiln cannot read which CUDA or ROCm it was built for")
			out = append(out, c)
			continue
		}
		if m.Path != "" {
			// A container sees none of the node's files but the model the
			// node's cache mounts for it.
			why = append(why, fmt.Sprintf("%s: %s's images would not see the model at %s on the node: store it in the lab's registry (kiln model push) and serve it by its reference, or run the engine where it is installed (--process)", n.Name, e.Name, m.Path))
			continue
		}
		var images []Image
		for _, im := range e.Images {
			if im.Vendor == "" || strings.EqualFold(im.Vendor, vendor) {
				images = append(images, im)
			}
		}
		if len(images) == 0 {
			why = append(why, fmt.Sprintf("%s: %s has no image for %s GPUs in kiln's catalogue", n.Name, e.Name, vendor))
			continue
		}
		if size.gpus == 0 {
			why = append(why, fmt.Sprintf("%s: %s: %s", n.Name, e.Name, fitWhy))
			continue
		}
		picked := false
		for _, im := range images {
			reqs, from := requirementsOf(im, read)
			var nr compat.NodeReport
			if reqs == nil {
				// The user's image, which kiln compat has not read.
				nr = compat.NodeReport{Verdict: compat.Unknown, Reasons: []string{"kiln compat has not read " + im.Ref + " (kiln compat " + im.Ref + " reads it)"}}
			} else {
				nr = compat.Check(reqs, compat.Node{Name: n.Name, Snapshot: s}, k)
			}
			if nr.Verdict == compat.Fails {
				why = append(why, fmt.Sprintf("%s: %s skipped: %s", n.Name, im.Ref, firstReason(nr)))
				continue
			}
			c := choiceOf(e, n.Name, im.Ref, size, link, req)
			c.Verdict, c.VerdictFrom = nr.Verdict, from
			if nr.Verdict == compat.Unknown {
				c.Notes = append(c.Notes, "kiln compat cannot tell whether this image runs here: "+firstReason(nr))
			}
			out = append(out, c)
			picked = true
			break
		}
		if !picked {
			why = append(why, fmt.Sprintf("%s: no image of %s runs on its GPUs", n.Name, e.Name))
		}
	}
	return out, why
}

func choiceOf(e Engine, node, image string, size sized, link map[int]string, req Request) Choice {
	l := link[size.island[0]]
	if size.gpus == 1 {
		l = "one GPU"
	}
	return Choice{Engine: e.Name, Image: image, Node: node, GPUs: size.gpus, Island: size.island, Link: l,
		MemoryPerGPUBytes: size.mem, CapacityBytes: size.capacity, Context: req.Context, Batch: req.Batch,
		Notes: append([]string(nil), size.notes...)}
}

// ggufReserve is what llama.cpp's server takes beyond weights and KV cache
// on a GPU: the CUDA context and its compute buffers, taken as 1 GiB.
const ggufReserve = 1 << 30

type sized struct {
	gpus          int
	island        []int
	mem, capacity float64
	notes         []string
}

// sizeOn is the fewest GPUs of one island that hold the model with the
// engine, or why none does.
func sizeOn(m Model, req Request, e Engine, s *snapshot.Snapshot, islands [][]int, k *kb.KB) (sized, string) {
	largest := 0
	for _, is := range islands {
		largest = max(largest, len(is))
	}
	degrees := []int{req.GPUs}
	if req.GPUs == 0 {
		degrees = nil
		for tp := 1; tp <= largest; tp *= 2 {
			degrees = append(degrees, tp)
		}
	}
	if !e.TensorParallel {
		if req.GPUs > 1 {
			return sized{}, fmt.Sprintf("it does not shard a model over GPUs, and %d were asked", req.GPUs)
		}
		degrees = []int{1}
	}
	var last string
	for _, tp := range degrees {
		island := islandFor(islands, tp)
		if island == nil {
			return sized{}, fmt.Sprintf("%d GPUs joined by NVLink or xGMI are needed; its largest such group is %d", tp, largest)
		}
		if m.Format == FormatGGUF {
			// A GGUF file's weights are the file (quantised); its KV cache
			// comes from the header's shape, at llama.cpp's default f16.
			capacity := float64(minMemory(s, island))
			if capacity == 0 {
				return sized{}, "its GPUs' memory is unknown, so kiln cannot size the model there"
			}
			need := float64(m.WeightsBytes) + ggufReserve
			var notes []string
			if m.Arch != nil {
				need += float64(req.Batch) * m.Arch.KVCacheBytes(req.Context, 2)
			} else {
				notes = append(notes, "sized by its weights file alone: its header gave no shape, so its KV cache is not counted")
			}
			if need <= capacity {
				return sized{gpus: tp, island: island, mem: need, capacity: capacity, notes: notes}, ""
			}
			last = fmt.Sprintf("it needs %s (weights, KV cache of %d sequences of %d tokens, 1 GiB for the runtime) of a GPU of %s",
				units.Bytes(uint64(need)), req.Batch, req.Context, units.Bytes(uint64(capacity)))
			continue
		}
		c, err := plan.SnapshotCluster(s, k, tp, 0)
		if err != nil {
			return sized{}, err.Error()
		}
		j := plan.Job{Model: *m.Arch, Mode: plan.ModeInfer, Precision: m.Precision, GlobalBatch: req.Batch,
			Seq: max(req.Context-min(req.Context/4, 1024), 1), GenTokens: min(req.Context/4, 1024)}
		est, err := plan.Evaluate(j, c, plan.Layout{DP: 1, TP: tp, PP: 1, VP: 1, MicroBatch: 1, Recompute: plan.RecomputeNone, SequenceParallel: true})
		if err != nil {
			last = err.Error()
			continue
		}
		if est.Fits {
			return sized{gpus: tp, island: island, mem: est.MemoryPerGPUBytes, capacity: est.MemoryCapacityBytes}, ""
		}
		last = fmt.Sprintf("on %d GPUs it needs %s a GPU of %s (%d sequences of %d tokens)", tp,
			units.Bytes(uint64(est.MemoryPerGPUBytes)), units.Bytes(uint64(est.MemoryCapacityBytes)), req.Batch, req.Context)
	}
	why := "the model does not fit: " + last
	if req.GPUs == 0 && e.TensorParallel && largest < len(s.GPUs) {
		why += fmt.Sprintf("; more GPUs would take tensor parallelism beyond its largest NVLink or xGMI group (%d of its %d GPUs), which kiln serve does not do", largest, len(s.GPUs))
	}
	return sized{}, why
}

// islandsOf groups the node's GPUs by NVLink or xGMI (a GPU with neither
// is a group of one), largest first, and names each group's link.
func islandsOf(s *snapshot.Snapshot, k *kb.KB) ([][]int, map[int]string, error) {
	mx, err := topo.Build(s, k)
	if err != nil {
		return nil, nil, err
	}
	idx := mx.GPUs()
	parent := map[int]int{}
	for _, i := range idx {
		parent[i] = i
	}
	find := func(i int) int {
		for parent[i] != i {
			i = parent[i]
		}
		return i
	}
	for a := range idx {
		for b := a + 1; b < len(idx); b++ {
			c := mx.Cells[idx[a]][idx[b]]
			if c.Kind == topo.LinkNVLink || c.Kind == topo.LinkXGMI {
				parent[find(idx[b])] = find(idx[a])
			}
		}
	}
	groups := map[int][]int{}
	for n, i := range idx {
		groups[find(i)] = append(groups[find(i)], n) // snapshot GPU order
	}
	var out [][]int
	link := map[int]string{}
	for root, g := range groups {
		out = append(out, g)
		kind := "one GPU"
		if len(g) > 1 {
			kind = "NVLink"
			for _, j := range idx {
				if j != root && find(j) == root && mx.Cells[root][j].Kind == topo.LinkXGMI {
					kind = "xGMI"
				}
			}
		}
		link[g[0]] = kind
	}
	sort.Slice(out, func(i, j int) bool {
		if len(out[i]) != len(out[j]) {
			return len(out[i]) > len(out[j])
		}
		return out[i][0] < out[j][0]
	})
	return out, link, nil
}

// islandFor is the first tp GPUs of the smallest island that has tp.
func islandFor(islands [][]int, tp int) []int {
	var best []int
	for _, is := range islands {
		if len(is) >= tp && (best == nil || len(is) < len(best)) {
			best = is
		}
	}
	if best == nil {
		return nil
	}
	return best[:tp]
}

func minMemory(s *snapshot.Snapshot, gpus []int) uint64 {
	var m uint64
	for _, i := range gpus {
		if i < len(s.GPUs) {
			if b := s.GPUs[i].MemoryTotalBytes; b > 0 && (m == 0 || b < m) {
				m = b
			}
		}
	}
	return m
}

// requirementsOf is what kiln compat read of the image, or what the
// catalogue declares of it.
func requirementsOf(im Image, read ImageReader) (*compat.Requirements, string) {
	if read != nil {
		if r := read(im.Ref); r != nil {
			return r, "read by kiln compat"
		}
	}
	if im.CUDA == "" && im.ROCm == "" {
		return nil, "not read (the user's image)"
	}
	r := &compat.Requirements{Image: im.Ref}
	switch {
	case im.CUDA != "":
		r.CUDA, r.CUDAFrom = im.CUDA, "kiln's engine catalogue: "+im.Source
		// Images built on nvidia/cuda carry NVIDIA_REQUIRE_CUDA=cuda>=X.Y,
		// which the container runtime checks at start. Its brand clauses,
		// which let datacenter GPUs start on older drivers, are left out:
		// without a read of the image kiln takes the stricter side.
		r.Require = "cuda>=" + im.CUDA
		if e, err := require.Parse(r.Require); err == nil {
			r.RequireExpr = &e
		}
	case im.ROCm != "":
		r.ROCm, r.ROCmFrom = im.ROCm, "kiln's engine catalogue: "+im.Source
	}
	return r, "kiln's engine catalogue (the image was not read)"
}

func firstReason(nr compat.NodeReport) string {
	if len(nr.Reasons) > 0 {
		return nr.Reasons[0]
	}
	for _, g := range nr.GPUs {
		if len(g.Reasons) > 0 {
			return g.Reasons[0]
		}
	}
	return string(nr.Verdict)
}

// verdictRank puts what runs natively first and an unknown last.
func verdictRank(v compat.Verdict) int {
	switch v {
	case compat.Runs:
		return 0
	case compat.Unknown:
		return 9
	}
	return 1
}

func engineNames(c *Catalogue) []string {
	var out []string
	for _, e := range c.Engines {
		out = append(out, e.Name)
	}
	return out
}
