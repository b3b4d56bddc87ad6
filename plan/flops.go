package plan

// Recomputation strategies (Korthikanti et al. 2022).
const (
	RecomputeNone      = "none"
	RecomputeSelective = "selective"
	RecomputeFull      = "full"
)

// forwardFLOPsPerToken is the forward-pass FLOPs of one token at context
// length s through the transformer blocks (matmuls: 2 FLOPs per active
// parameter; attention scores and their product with V: 4·s·attnDim per
// block, counted without a causal mask as Megatron-LM counts them).
func (m *Model) blockForwardFLOPsPerToken(s float64) float64 {
	matmul := 2 * (m.activeBlockParams())
	attn := 4 * s * m.attnDim() * float64(m.blocks())
	if m.EncoderLayers > 0 {
		attn += 4 * s * m.attnDim() * float64(m.Layers) // decoder cross-attention
	}
	return matmul + attn
}

// activeBlockParams counts the block matmul parameters one token passes
// through (norms excluded: they are not matrix multiplies).
func (m *Model) activeBlockParams() float64 {
	dec := m.attnParams() + float64(m.activeExperts())*m.mlpParams()
	if m.EncoderLayers > 0 {
		dec += m.attnParams()
	}
	if m.Experts > 1 {
		dec += float64(m.Hidden) * float64(m.Experts)
	}
	enc := m.attnParams() + m.mlpParams()
	return float64(m.Layers)*dec + float64(m.EncoderLayers)*enc
}

// logitFLOPsPerToken is the output projection's forward FLOPs per token.
func (m *Model) logitFLOPsPerToken() float64 {
	return 2 * float64(m.Hidden) * float64(m.Vocab)
}

// recomputeFLOPsPerToken is what one recomputation strategy adds per token.
func (m *Model) recomputeFLOPsPerToken(s float64, recompute string) float64 {
	switch recompute {
	case RecomputeFull:
		return m.blockForwardFLOPsPerToken(s)
	case RecomputeSelective:
		// Only the attention core (QKᵀ, softmax, ·V) runs again.
		return 4 * s * m.attnDim() * float64(m.blocks())
	}
	return 0
}

// TrainFLOPs is the FLOPs of one training step over B sequences of s
// tokens: forward, backward (twice the forward) and what recomputation
// adds. With recompute "none" it is the model FLOPs that MFU counts; for a
// GPT model with recompute "full" it equals the Megatron-LM formula
// (Narayanan et al. 2021, equation 3; checked in flops_test.go).
func (m *Model) TrainFLOPs(B, s float64, recompute string) float64 {
	perToken := 3*(m.blockForwardFLOPsPerToken(s)+m.logitFLOPsPerToken()) + m.recomputeFLOPsPerToken(s, recompute)
	return B * s * perToken
}

// ForwardFLOPs is the FLOPs of a forward pass (inference prefill) over B
// sequences of s tokens, logits included.
func (m *Model) ForwardFLOPs(B, s float64) float64 {
	return B * s * (m.blockForwardFLOPsPerToken(s) + m.logitFLOPsPerToken())
}

// decodeFLOPsPerToken is the forward FLOPs of generating one token with a
// context of ctx tokens in the KV cache.
func (m *Model) decodeFLOPsPerToken(ctx float64) float64 {
	return 2*m.activeBlockParams() + 4*ctx*m.attnDim()*float64(m.Layers) + m.logitFLOPsPerToken()
}
