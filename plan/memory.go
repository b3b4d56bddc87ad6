package plan

import "math"

// Calibrated allowances for what the framework itself holds on a GPU.
const (
	// FixedOverheadBytes is the CUDA/ROCm context, communication library
	// buffers and kernel workspaces per GPU.
	FixedOverheadBytes = 2.0e9
	// FragmentationFraction is the caching allocator's slack on top of
	// tensors it holds.
	FragmentationFraction = 0.08
)

// Memory is what one GPU holds, in bytes (the most loaded GPU: the first
// pipeline stage in training).
type Memory struct {
	Weights     float64 `json:"weights_bytes"`
	Gradients   float64 `json:"gradients_bytes,omitempty"`
	Optimizer   float64 `json:"optimizer_bytes,omitempty"`
	Activations float64 `json:"activations_bytes"`
	KVCache     float64 `json:"kv_cache_bytes,omitempty"`
	// Buffers are gathered ZeRO-3 parameters and similar transient copies.
	Buffers float64 `json:"buffers_bytes,omitempty"`
	// Overhead is the framework and fragmentation allowance.
	Overhead float64 `json:"overhead_bytes"`
	Total    float64 `json:"total_bytes"`
}

// ModelStates is weights, gradients and optimizer state: what the ZeRO
// paper's Table 1 counts.
func (m Memory) ModelStates() float64 { return m.Weights + m.Gradients + m.Optimizer }

// ModelStateBytes is the per-GPU model-state memory of the ZeRO paper
// (section 3.1 and Table 1): Ψ parameters, 2Ψ bytes of fp16 weights, 2Ψ of
// fp16 gradients, KΨ of optimizer state, over nd data-parallel GPUs at the
// given stage (0 baseline, 1 P_os, 2 P_os+g, 3 P_os+g+p).
func ModelStateBytes(params, k float64, nd, stage int) float64 {
	d := float64(max(nd, 1))
	w, g, o := 2*params, 2*params, k*params
	if stage >= 1 {
		o /= d
	}
	if stage >= 2 {
		g /= d
	}
	if stage >= 3 {
		w /= d
	}
	return w + g + o
}

// stageParams is the parameter count on the most loaded pipeline stage of
// one tensor-parallel rank: ceil(blocks/pp) blocks plus an embedding (both
// embeddings when there is one stage).
func (m *Model) stageParams(tp, pp int) float64 {
	per := math.Ceil(float64(m.blocks())/float64(pp)) * m.layerParams()
	emb := float64(m.Vocab) * float64(m.Hidden)
	if pp == 1 {
		emb = m.embeddingParams()
	}
	return (per + emb) / float64(tp)
}

// layerActivationBytes is the activation memory of one transformer block
// for a micro-batch of b sequences of s tokens with tensor parallelism t,
// after Korthikanti et al. 2022, Table 2: sbh(34 + 5as/h) bytes without
// parallelism; with tensor parallelism only the 24sbh + 5as²b inside the
// attention and MLP divide by t (10sbh stay whole); with sequence
// parallelism everything divides by t; selective recomputation drops the
// 5as²b of the attention core; full recomputation keeps only the block's
// 2sbh input. Generalised from the paper's GPT block to grouped-query
// attention, gated and mixture-of-experts MLPs by counting the same stored
// tensors (the paper's 34 = 11 attention + 19 MLP + 4 norms, in units of
// sbh at 2 bytes per element). A fused attention kernel (flash) stores no
// scores, like selective recomputation.
func (m *Model) layerActivationBytes(b, s float64, t int, sp bool, recompute string, eb float64, flash bool) float64 {
	h := float64(m.Hidden)
	tf := float64(t)
	if recompute == RecomputeFull {
		in := 2 * s * b * h * eb / 2
		if sp {
			in /= tf
		}
		return in
	}
	// Elements stored per token, scaled to the paper's 2-byte convention
	// (a dropout mask counts one byte).
	ffn := float64(m.FFN) * float64(m.activeExperts())
	attnParallel := 2*m.attnDim() + 4*m.kvDim() + 2*m.attnDim() // Q, K, V, projection input
	var mlpParallel float64
	if m.Gated {
		mlpParallel = 6 * ffn // gate and up outputs, activation output
	} else {
		mlpParallel = 4 * ffn // activation input and output
	}
	replicated := 10 * h // two norm inputs (4h), QKV and MLP inputs (4h), two dropout masks (2h)
	parallel := attnParallel + mlpParallel
	scores := 0.0
	if recompute != RecomputeSelective && !flash {
		scores = 5 * float64(m.Heads) * s // softmax output, dropout mask and output
	}
	var perToken float64
	if sp {
		perToken = (replicated + parallel + scores) / tf
	} else {
		perToken = replicated + (parallel+scores)/tf
	}
	return s * b * perToken * eb / 2
}

// trainMemory is one GPU's memory for training under layout l with m
// micro-batches per step.
func trainMemory(j Job, c *Cluster, l Layout, micro int) Memory {
	md := &j.Model
	psi := md.stageParams(l.TP, l.PP)
	shard := float64(l.DP)
	if l.Hybrid {
		shard = float64(hybridGroup(c, l))
	}
	wb, gb, k := j.weightBytes(), j.gradBytes(), j.OptimizerBytes()
	var mem Memory
	mem.Weights, mem.Gradients, mem.Optimizer = psi*wb, psi*gb, psi*k
	if l.Zero >= 1 {
		mem.Optimizer /= shard
	}
	if l.Zero >= 2 {
		mem.Gradients /= shard
	}
	if l.Zero >= 3 {
		mem.Weights /= shard
		// Gathered parameters of the block in use and the one prefetched.
		mem.Buffers = 2 * md.layerParams() / float64(l.TP) * wb
	}
	b, s := float64(l.MicroBatch), float64(j.Seq)
	eb := j.activationBytes()
	sp := l.SequenceParallel && l.TP > 1
	layers := math.Ceil(float64(md.blocks()) / float64(l.PP))
	// 1F1B: the first stage holds min(pp, micro-batches) in flight.
	inflight := float64(min(l.PP, max(micro, 1)))
	flash := !j.NoFlashAttention
	act := layers * inflight * md.layerActivationBytes(b, s, l.TP, sp, l.Recompute, eb, flash)
	if l.VP > 1 {
		// The interleaved schedule holds more in flight: 1 + (p-1)/(p·v)
		// (Korthikanti et al. 2022, section 4.2.3).
		act *= 1 + float64(l.PP-1)/float64(l.PP*l.VP)
	}
	if l.Recompute == RecomputeFull {
		// Backward recomputes one block at a time and holds its activations.
		act += md.layerActivationBytes(b, s, l.TP, sp, RecomputeNone, eb, flash)
	}
	if l.PP == 1 {
		// fp32 logits for the cross-entropy (4·s·b·V/t bytes in the paper).
		act += 4 * s * b * float64(md.Vocab) / float64(l.TP)
	}
	mem.Activations = act
	finish(&mem)
	return mem
}

// inferMemory is one GPU's memory for serving batch requests (per
// data-parallel replica) of prompt+gen tokens.
func inferMemory(j Job, l Layout, batch int) Memory {
	md := &j.Model
	wb := j.inferenceWeightBytes()
	var mem Memory
	mem.Weights = md.Params() * wb / float64(l.TP*l.PP)
	ctx := float64(j.Seq + j.GenTokens)
	mem.KVCache = float64(batch) * ctx * md.kvBytesPerToken(wb) / float64(l.PP) / float64(kvShards(md, l.TP))
	ffn := float64(md.FFN) * float64(md.activeExperts())
	// Prefill working set of one block and the logits of the last token.
	mem.Activations = float64(batch)*float64(j.Seq)*(4*float64(md.Hidden)+3*ffn)*2/float64(l.TP) + float64(batch)*float64(md.Vocab)*4
	finish(&mem)
	return mem
}

// kvBytesPerToken is the KV cache of one token over all layers: 2 (K and
// V) x layers x kv heads x head dim x bytes.
func (m *Model) kvBytesPerToken(bytes float64) float64 {
	return 2 * float64(m.Layers) * m.kvDim() * bytes
}

// KVCacheBytes is the KV cache of tokens tokens at the given bytes per
// element.
func (m *Model) KVCacheBytes(tokens int, bytes float64) float64 {
	return float64(tokens) * m.kvBytesPerToken(bytes)
}

// kvShards is how many ways tensor parallelism splits the KV heads: heads
// are replicated when tp exceeds them.
func kvShards(m *Model, tp int) int { return max(1, min(tp, m.kvHeads())) }

func finish(mem *Memory) {
	tensors := mem.Weights + mem.Gradients + mem.Optimizer + mem.Activations + mem.KVCache + mem.Buffers
	mem.Overhead = FixedOverheadBytes + FragmentationFraction*tensors
	mem.Total = tensors + mem.Overhead
}

// hybridGroup is the ZeRO-3 shard group of FSDP hybrid sharding: the
// data-parallel ranks inside one node.
func hybridGroup(c *Cluster, l Layout) int {
	in := max(1, c.GPUsPerNode/l.TP)
	return max(1, min(l.DP, in))
}
