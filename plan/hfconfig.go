package plan

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
)

// ParseHFConfig reads a Hugging Face config.json (GPT-2, GPT-NeoX, Llama,
// Mistral, Mixtral, Qwen, T5, ViT and the like) into a Model. name is used
// when the file does not say which model it is.
func ParseHFConfig(data []byte, name string) (Model, error) {
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		return Model{}, fmt.Errorf("config.json: %w", err)
	}
	// Multimodal wrappers keep the language model under text_config.
	if tc, ok := raw["text_config"].(map[string]any); ok {
		for k, v := range tc {
			if _, has := raw[k]; !has || k == "num_hidden_layers" || k == "hidden_size" {
				raw[k] = v
			}
		}
	}
	c := hfConfig{raw: raw}
	m := Model{Name: name, Source: "Hugging Face config.json"}
	if n, ok := raw["_name_or_path"].(string); ok && strings.TrimSpace(n) != "" {
		m.Name = strings.TrimSpace(n)
	}
	modelType, _ := raw["model_type"].(string)
	modelType = strings.ToLower(modelType)

	m.Hidden = c.int("hidden_size", "n_embd", "d_model", "dim")
	m.Heads = c.int("num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads")
	m.KVHeads = c.int("num_key_value_heads", "n_kv_heads", "multi_query_group_num")
	m.HeadDim = c.int("head_dim", "d_kv", "kv_channels")
	m.Vocab = c.int("vocab_size", "padded_vocab_size", "num_labels")
	m.Seq = c.int("max_position_embeddings", "n_positions", "n_ctx", "seq_length", "max_sequence_length")
	m.Experts = c.int("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
	m.ExpertsPerToken = c.int("num_experts_per_tok", "num_experts_per_token", "moe_top_k", "top_k")
	m.FFN = c.int("intermediate_size", "n_inner", "d_ff", "ffn_dim", "ffn_hidden_size", "encoder_ffn_dim")
	if m.Experts > 1 {
		if f := c.int("moe_intermediate_size"); f > 0 {
			m.FFN = f
		}
	}
	if m.FFN == 0 && m.Hidden > 0 {
		m.FFN = 4 * m.Hidden // GPT-2 and GPT-NeoX leave n_inner null: 4 x hidden
	}
	tied, hasTied := raw["tie_word_embeddings"].(bool)
	m.Tied = tied || (!hasTied && (modelType == "gpt2" || modelType == "t5" || modelType == "vit"))

	switch {
	case modelType == "t5" || modelType == "mt5" || modelType == "bart":
		m.EncoderLayers = c.int("num_layers", "encoder_layers")
		m.Layers = c.int("num_decoder_layers", "decoder_layers")
		if m.Layers == 0 {
			m.Layers = m.EncoderLayers
		}
		proj, _ := raw["feed_forward_proj"].(string)
		m.Gated = strings.HasPrefix(strings.ToLower(proj), "gated")
		if m.Seq == 0 {
			m.Seq = 512
		}
	default:
		m.Layers = c.int("num_hidden_layers", "n_layer", "num_layers", "n_layers")
	}
	if modelType == "vit" || modelType == "deit" {
		img, patch := c.int("image_size"), c.int("patch_size")
		if img > 0 && patch > 0 {
			m.Seq = (img/patch)*(img/patch) + 1
		}
		if m.Vocab == 0 {
			m.Vocab = 1000
		}
	}
	act, _ := raw["hidden_act"].(string)
	act = strings.ToLower(act)
	switch {
	case act == "silu" || act == "swiglu" || strings.Contains(act, "glu"):
		m.Gated = true
	case strings.Contains(modelType, "llama"), strings.Contains(modelType, "mistral"),
		strings.Contains(modelType, "mixtral"), strings.Contains(modelType, "qwen"),
		strings.Contains(modelType, "gemma"), strings.Contains(modelType, "phi3"):
		m.Gated = true
	}
	if m.Seq > 131072*8 {
		m.Seq = 131072 // configs of long-context models state huge maxima
	}
	if m.Seq > 8192 {
		m.MaxSeq, m.Seq = m.Seq, 8192
	}
	if m.Seq == 0 {
		m.Seq = 2048
	}
	if m.Name == "" {
		m.Name = "config.json"
	}
	if err := m.Validate(); err != nil {
		return Model{}, fmt.Errorf("config.json: %w", err)
	}
	return m, nil
}

type hfConfig struct{ raw map[string]any }

// int returns the first key holding a positive whole number that fits in
// an int32 (sizes beyond that are not real configs); 0 when none does.
func (c hfConfig) int(keys ...string) int {
	for _, k := range keys {
		v, ok := c.raw[k].(float64)
		if !ok || v <= 0 || v != math.Trunc(v) || v > math.MaxInt32 {
			continue
		}
		return int(v)
	}
	return 0
}
