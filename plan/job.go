package plan

import (
	"fmt"
	"strings"
)

// Modes.
const (
	ModeTrain = "train"
	ModeInfer = "infer"
)

// Optimizers.
const (
	OptAdamW    = "adamw"
	OptAdam8bit = "adam8bit"
	OptSGD      = "sgd"
)

// Job is what to plan: a model, training or inference, and its sizes.
type Job struct {
	Model Model  `json:"model"`
	Mode  string `json:"mode"`
	// Precision of the matrix multiplies: bf16 (default), fp16, fp8, tf32,
	// fp32. Mixed precision (bf16, fp16, fp8) keeps fp32 master weights in
	// the optimizer.
	Precision string `json:"precision"`
	// Optimizer: adamw (default), adam8bit (8-bit states), sgd (momentum).
	Optimizer string `json:"optimizer"`
	// GlobalBatch is sequences per training step, or concurrent requests
	// when serving.
	GlobalBatch int `json:"global_batch"`
	// Seq is the training sequence length, or the prompt length when serving.
	Seq int `json:"seq"`
	// GenTokens is the tokens generated per request when serving.
	GenTokens int `json:"gen_tokens,omitempty"`
	// NoFlashAttention models a stack that materialises the attention
	// scores (s x s per head) instead of a fused kernel such as
	// FlashAttention: they take activation memory and HBM traffic.
	NoFlashAttention bool `json:"no_flash_attention,omitempty"`
}

// Normalize fills defaults and checks the job.
func (j Job) Normalize() (Job, error) {
	if err := j.Model.Validate(); err != nil {
		return j, err
	}
	if j.Mode == "" {
		j.Mode = ModeTrain
	}
	if j.Mode != ModeTrain && j.Mode != ModeInfer {
		return j, fmt.Errorf("mode %q: want train or infer", j.Mode)
	}
	j.Precision = strings.ToLower(j.Precision)
	if j.Precision == "" {
		j.Precision = "bf16"
	}
	if _, ok := precisionFallback[j.Precision]; !ok {
		return j, fmt.Errorf("precision %q: want bf16, fp16, fp8, tf32 or fp32", j.Precision)
	}
	j.Optimizer = strings.ToLower(j.Optimizer)
	switch j.Optimizer {
	case "", "adam", OptAdamW:
		j.Optimizer = OptAdamW
	case OptAdam8bit, "adamw8bit", "8bit":
		j.Optimizer = OptAdam8bit
	case OptSGD:
	default:
		return j, fmt.Errorf("optimizer %q: want adamw, adam8bit or sgd", j.Optimizer)
	}
	if j.Seq <= 0 {
		j.Seq = j.Model.Seq
	}
	if j.Seq <= 0 {
		j.Seq = 2048
	}
	if j.GlobalBatch <= 0 {
		if j.Mode == ModeTrain {
			// About four million tokens, as GPT-3 175B and Llama 2 trained.
			j.GlobalBatch = max(1, (4<<20)/j.Seq)
		} else {
			j.GlobalBatch = 1
		}
	}
	if j.Mode == ModeInfer && j.GenTokens <= 0 {
		j.GenTokens = 256
	}
	return j, nil
}

// mixed reports whether the job trains in mixed precision.
func (j Job) mixed() bool { return j.Precision != "fp32" && j.Precision != "tf32" }

// weightBytes is the bytes per parameter of the working weights.
func (j Job) weightBytes() float64 {
	if j.mixed() {
		return 2 // fp8 training keeps bf16 weights and casts per GEMM
	}
	return 4
}

// gradBytes is the bytes per parameter of gradients (the ZeRO paper's 2Ψ
// for mixed precision).
func (j Job) gradBytes() float64 { return j.weightBytes() }

// OptimizerBytes is K of the ZeRO paper: optimizer-state bytes per
// parameter. Mixed-precision Adam keeps an fp32 master copy, momentum and
// variance: K = 12.
func (j Job) OptimizerBytes() float64 {
	master := 0.0
	if j.mixed() {
		master = 4
	}
	switch j.Optimizer {
	case OptAdam8bit:
		return master + 2
	case OptSGD:
		return master + 4
	}
	return master + 8
}

// activationBytes is the bytes per activation element (16-bit activations
// under mixed precision).
func (j Job) activationBytes() float64 {
	if j.mixed() {
		return 2
	}
	return 4
}

// inferenceWeightBytes is bytes per parameter when serving.
func (j Job) inferenceWeightBytes() float64 {
	switch j.Precision {
	case "fp8":
		return 1
	case "fp32", "tf32":
		return 4
	}
	return 2
}
