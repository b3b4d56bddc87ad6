package plan

import (
	"fmt"
	"math"
)

// Calibrated time constants.
const (
	// dpOverlap is the share of the backward pass that data-parallel
	// gradient traffic (or ZeRO-3 gathers, per micro-batch) hides behind,
	// as DDP buckets and FSDP prefetching achieve.
	dpOverlap = 0.8
	// memEff is the share of HBM bandwidth that streaming weights, KV cache
	// and optimizer states reach.
	memEff = 0.8
	// elementwiseTraffic is the HBM bytes that the non-matmul work of a
	// block (norms, activations, dropout, softmax, residual adds) moves per
	// byte of activation the block stores, over forward and backward.
	elementwiseTraffic = 4.0
)

// Breakdown says where a step's time goes, in seconds per step on the
// slowest GPU. Communication figures are what is left exposed after
// overlap.
type Breakdown struct {
	ComputeS   float64 `json:"compute_s"`
	RecomputeS float64 `json:"recompute_s,omitempty"`
	BubbleS    float64 `json:"pipeline_bubble_s,omitempty"`
	TPCommS    float64 `json:"tensor_parallel_comm_s,omitempty"`
	PPCommS    float64 `json:"pipeline_comm_s,omitempty"`
	DPCommS    float64 `json:"data_parallel_comm_s,omitempty"`
	OptimizerS float64 `json:"optimizer_s,omitempty"`
	// DecodeS is the memory-bound token generation time (serving).
	DecodeS float64 `json:"decode_s,omitempty"`
	TPLink  string  `json:"tensor_parallel_link,omitempty"`
	PPLink  string  `json:"pipeline_link,omitempty"`
	DPLink  string  `json:"data_parallel_link,omitempty"`
}

// Total is the step time.
func (b Breakdown) Total() float64 {
	return b.ComputeS + b.RecomputeS + b.BubbleS + b.TPCommS + b.PPCommS + b.DPCommS + b.OptimizerS + b.DecodeS
}

// Estimate is the predicted memory and speed of one layout.
type Estimate struct {
	Layout       Layout `json:"layout"`
	LayoutString string `json:"layout_string"`
	Sharding     string `json:"sharding"`
	// Fits is true when MemoryPerGPUBytes is within the GPU's memory.
	Fits                bool    `json:"fits"`
	MemoryPerGPUBytes   float64 `json:"memory_per_gpu_bytes"`
	MemoryCapacityBytes float64 `json:"memory_capacity_bytes"`
	Memory              Memory  `json:"memory"`
	// StepTimeS is one training step, or one batch of requests served
	// (prefill and every generated token).
	StepTimeS float64 `json:"step_time_s"`
	// TokensPerS is tokens trained per second, or tokens generated per
	// second when serving, over all GPUs.
	TokensPerS       float64 `json:"tokens_per_s"`
	TokensPerSPerGPU float64 `json:"tokens_per_s_per_gpu"`
	// TFLOPSPerGPU counts model FLOPs (no recomputation), the basis of MFU.
	TFLOPSPerGPU float64 `json:"tflops_per_gpu"`
	// HardwareTFLOPSPerGPU also counts recomputed FLOPs, as Megatron-LM
	// 2021 reports its throughput.
	HardwareTFLOPSPerGPU float64 `json:"hardware_tflops_per_gpu"`
	MFU                  float64 `json:"mfu"`
	// GlobalBatch is the sequences per step (rounded up to whole
	// micro-batches), or concurrent requests when serving.
	GlobalBatch  int       `json:"global_batch"`
	MicroBatches int       `json:"micro_batches,omitempty"`
	Breakdown    Breakdown `json:"breakdown"`
	// Serving only.
	TimeToFirstTokenS   float64 `json:"time_to_first_token_s,omitempty"`
	TimePerOutputTokenS float64 `json:"time_per_output_token_s,omitempty"`
}

// Evaluate predicts memory and time of one layout. The layout must use all
// of the cluster's GPUs (Layout.Complete).
func Evaluate(j Job, c *Cluster, l Layout) (Estimate, error) {
	j, err := j.Normalize()
	if err != nil {
		return Estimate{}, err
	}
	if err := checkLayout(j, c, l); err != nil {
		return Estimate{}, err
	}
	if j.Mode == ModeInfer {
		return evalInfer(j, c, l), nil
	}
	return evalTrain(j, c, l), nil
}

func checkLayout(j Job, c *Cluster, l Layout) error {
	if l.DP < 1 || l.TP < 1 || l.PP < 1 || l.MicroBatch < 1 || l.VP < 0 {
		return fmt.Errorf("layout %s: every degree must be at least 1", l)
	}
	if l.GPUs() != c.GPUs() {
		return fmt.Errorf("layout %s uses %d GPUs; the hardware has %d", l, l.GPUs(), c.GPUs())
	}
	if l.PP*max(l.VP, 1) > j.Model.blocks() {
		return fmt.Errorf("layout %s: %d pipeline stages for %d layers", l, l.PP*max(l.VP, 1), j.Model.blocks())
	}
	if l.VP > 1 && l.PP == 1 {
		return fmt.Errorf("layout %s: interleaved stages (vp) need pipeline parallelism", l)
	}
	if j.Model.Heads%l.TP != 0 {
		return fmt.Errorf("layout %s: %d attention heads do not split over tp=%d", l, j.Model.Heads, l.TP)
	}
	if l.Zero < 0 || l.Zero > 3 || (l.Hybrid && l.Zero != 3) {
		return fmt.Errorf("layout %s: zero stage must be 0-3 (hybrid only with 3)", l)
	}
	switch l.Recompute {
	case RecomputeNone, RecomputeSelective, RecomputeFull:
	default:
		return fmt.Errorf("layout %s: recompute must be none, selective or full", l)
	}
	return nil
}

func (j Job) computeRate(c *Cluster) float64 {
	peak, _ := c.GPU.Peak(j.Precision)
	return peak * 1e12 * c.GPU.Attainable
}

func evalTrain(j Job, c *Cluster, l Layout) Estimate {
	md := &j.Model
	n := float64(c.GPUs())
	micro := int(math.Ceil(float64(j.GlobalBatch) / float64(l.DP*l.MicroBatch)))
	B := float64(micro * l.DP * l.MicroBatch)
	s := float64(j.Seq)
	rate := j.computeRate(c)

	fModel := md.TrainFLOPs(B, s, RecomputeNone)
	fHW := md.TrainFLOPs(B, s, l.Recompute)
	var bd Breakdown
	bd.ComputeS = fModel / n / rate
	bd.RecomputeS = (fHW - fModel) / n / rate
	// Elementwise work is bound by memory bandwidth: time in proportion to
	// the activations a block stores (per token, on this GPU's share of the
	// tensor-parallel split), once more for what recomputation reruns.
	{
		sp := l.SequenceParallel && l.TP > 1
		flash := !j.NoFlashAttention
		perTok := md.layerActivationBytes(1, s, l.TP, sp, RecomputeNone, j.activationBytes(), flash) / s
		tokens := B * s / float64(l.DP) * float64(md.blocks()) / float64(l.PP)
		hbm := c.GPU.MemoryBandwidthGBps * 1e9 * memEff
		elem := elementwiseTraffic * perTok * tokens / hbm
		bd.ComputeS += elem
		switch l.Recompute {
		case RecomputeFull:
			bd.RecomputeS += elem / 3
		case RecomputeSelective:
			if !flash {
				scores := 5 * float64(md.Heads) * s / float64(l.TP) * j.activationBytes() / 2
				bd.RecomputeS += elementwiseTraffic / 3 * scores * tokens / hbm
			}
		}
	}

	eb := j.activationBytes()
	tp := c.group(1, l.TP)
	dp := c.group(l.TP, l.DP)
	pp := c.group(l.TP*l.DP, l.PP)
	bd.TPLink, bd.DPLink, bd.PPLink = tp.desc, dp.desc, pp.desc

	// Tensor parallelism: two all-reduces (or with sequence parallelism an
	// all-gather and a reduce-scatter each, the same volume) per block in
	// the forward pass, two in the backward, two more when full
	// recomputation runs the forward again.
	layers := math.Ceil(float64(md.blocks()) / float64(l.PP))
	if l.TP > 1 {
		colls := 4.0
		if l.Recompute == RecomputeFull {
			colls = 6
		}
		msg := float64(l.MicroBatch) * s * float64(md.Hidden) * eb
		bd.TPCommS = float64(micro) * layers * colls * tp.allReduce(msg)
	}
	// Pipeline: a forward activation and a backward gradient per
	// micro-batch cross each stage boundary; the 1F1B bubble idles
	// (pp-1)/m of the work.
	if l.PP > 1 {
		msg := float64(l.MicroBatch) * s * float64(md.Hidden) * eb
		if l.TP > 1 {
			msg /= float64(l.TP) // scatter/gather across the tensor-parallel ranks
		}
		vp := float64(max(l.VP, 1))
		bd.PPCommS = 2 * float64(micro) * vp * pp.send(msg)
		bd.BubbleS = float64(l.PP-1) / (float64(micro) * vp) * (bd.ComputeS + bd.RecomputeS + bd.TPCommS)
	}
	// Data parallelism.
	psi := md.stageParams(l.TP, l.PP)
	gradBytes := psi * j.gradBytes()
	weightBytes := psi * j.weightBytes()
	backwardPerMicro := (bd.ComputeS + bd.RecomputeS) / float64(micro) * 2 / 3
	if l.DP > 1 {
		switch {
		case l.Zero >= 3 && l.Hybrid:
			S := hybridGroup(c, l)
			in := c.group(l.TP, S)
			out := c.group(l.TP*S, l.DP/S)
			perMicro := in.gather(weightBytes)*2 + in.gather(gradBytes)
			hidden := dpOverlap * (bd.ComputeS + bd.RecomputeS) / float64(micro)
			exposed := float64(micro) * math.Max(0, perMicro-hidden)
			exposed += math.Max(0, out.allReduce(gradBytes/float64(S))-dpOverlap*backwardPerMicro)
			bd.DPCommS = exposed
			bd.DPLink = in.desc + " inside a node; " + out.desc + " across nodes"
		case l.Zero >= 3:
			// Gather parameters for the forward and again for the backward,
			// reduce-scatter gradients: every micro-batch.
			perMicro := dp.gather(weightBytes)*2 + dp.gather(gradBytes)
			hidden := dpOverlap * (bd.ComputeS + bd.RecomputeS) / float64(micro)
			bd.DPCommS = float64(micro) * math.Max(0, perMicro-hidden)
		case l.Zero >= 1:
			// Reduce-scatter gradients once per step, all-gather updated
			// parameters after the optimizer (not hidden).
			rs := dp.gather(gradBytes)
			ag := dp.gather(weightBytes)
			bd.DPCommS = math.Max(0, rs-dpOverlap*backwardPerMicro) + ag
		default:
			bd.DPCommS = math.Max(0, dp.allReduce(gradBytes)-dpOverlap*backwardPerMicro)
		}
	}
	// Optimizer step: stream states, gradients and weights through HBM.
	shard := 1.0
	if l.Zero >= 1 {
		shard = float64(l.DP)
		if l.Hybrid {
			shard = float64(hybridGroup(c, l))
		}
	}
	bd.OptimizerS = psi / shard * (2*j.OptimizerBytes() + j.gradBytes() + 2*j.weightBytes()) / (c.GPU.MemoryBandwidthGBps * 1e9 * memEff)

	mem := trainMemory(j, c, l, micro)
	step := bd.Total()
	e := Estimate{
		Layout: l, LayoutString: l.String(), Sharding: l.Sharding(),
		Memory: mem, MemoryPerGPUBytes: mem.Total, MemoryCapacityBytes: c.MemoryBytes,
		Fits:        mem.Total <= c.MemoryBytes,
		StepTimeS:   step,
		TokensPerS:  B * s / step,
		GlobalBatch: int(B), MicroBatches: micro,
		Breakdown: bd,
	}
	e.TokensPerSPerGPU = e.TokensPerS / n
	e.TFLOPSPerGPU = fModel / n / step / 1e12
	e.HardwareTFLOPSPerGPU = fHW / n / step / 1e12
	peak, _ := c.GPU.Peak(j.Precision)
	e.MFU = e.TFLOPSPerGPU / peak
	return e
}

// evalInfer serves GlobalBatch concurrent requests of Seq prompt tokens
// and GenTokens generated tokens on DP replicas of TP x PP GPUs each.
// Pipeline stages of one batch run one after another, so pipelining saves
// memory but not time here.
func evalInfer(j Job, c *Cluster, l Layout) Estimate {
	md := &j.Model
	batch := int(math.Ceil(float64(j.GlobalBatch) / float64(l.DP)))
	b := float64(batch)
	s, gen := float64(j.Seq), float64(j.GenTokens)
	rate := j.computeRate(c)
	tpGPUs := float64(l.TP)
	wb := j.inferenceWeightBytes()
	tp := c.group(1, l.TP)
	pp := c.group(l.TP*l.DP, l.PP)
	var bd Breakdown
	bd.TPLink, bd.PPLink = tp.desc, pp.desc

	// Prefill: compute bound.
	fPrefill := md.ForwardFLOPs(b, s)
	bd.ComputeS = fPrefill / tpGPUs / rate
	msg := b * s * float64(md.Hidden) * 2
	tpPrefill := float64(md.blocks()) * 2 * tp.allReduce(msg)
	ppPrefill := float64(l.PP-1) * pp.send(msg/float64(l.TP))

	// Decode: each step streams the weights and the KV cache of the
	// replica's GPUs, or computes, whichever is slower.
	ctx := s + gen/2
	weights := md.Params() * wb / tpGPUs
	kv := b * ctx * md.kvBytesPerToken(wb) / float64(kvShards(md, l.TP))
	memTime := (weights + kv) / (c.GPU.MemoryBandwidthGBps * 1e9 * memEff)
	compTime := b * md.decodeFLOPsPerToken(ctx) / tpGPUs / rate
	stepMsg := b * float64(md.Hidden) * 2
	tpDecode := float64(md.blocks()) * 2 * tp.allReduce(stepMsg)
	ppDecode := float64(l.PP-1) * pp.send(stepMsg)
	bd.DecodeS = gen * math.Max(memTime, compTime)
	bd.TPCommS = tpPrefill + gen*tpDecode
	bd.PPCommS = ppPrefill + gen*ppDecode

	mem := inferMemory(j, l, batch)
	step := bd.Total()
	n := float64(c.GPUs())
	generated := b * float64(l.DP) * gen
	e := Estimate{
		Layout: l, LayoutString: fmt.Sprintf("dp=%d,tp=%d,pp=%d", l.DP, l.TP, l.PP), Sharding: "replicas",
		Memory: mem, MemoryPerGPUBytes: mem.Total, MemoryCapacityBytes: c.MemoryBytes,
		Fits:        mem.Total <= c.MemoryBytes,
		StepTimeS:   step,
		TokensPerS:  generated / step,
		GlobalBatch: batch * l.DP,
		Breakdown:   bd,
	}
	e.TimeToFirstTokenS = bd.ComputeS + tpPrefill + ppPrefill
	if gen > 0 {
		e.TimePerOutputTokenS = (bd.DecodeS + gen*(tpDecode+ppDecode)) / gen
	}
	e.TokensPerSPerGPU = e.TokensPerS / n
	flops := float64(l.DP) * (fPrefill + b*gen*md.decodeFLOPsPerToken(ctx))
	e.TFLOPSPerGPU = flops / n / step / 1e12
	e.HardwareTFLOPSPerGPU = e.TFLOPSPerGPU
	peak, _ := c.GPU.Peak(j.Precision)
	e.MFU = e.TFLOPSPerGPU / peak
	return e
}
