package plan

import (
	_ "embed"
	"fmt"
	"strings"
	"sync"

	"sigs.k8s.io/yaml"
)

// Model is a transformer's architecture: what memory and FLOPs depend on.
type Model struct {
	Name    string   `json:"name"`
	Aliases []string `json:"aliases,omitempty"`
	// Layers is the number of (decoder) transformer blocks.
	Layers int `json:"layers"`
	// EncoderLayers is the number of encoder blocks of an encoder-decoder
	// model (T5); zero for decoder-only and encoder-only models.
	EncoderLayers int `json:"encoder_layers,omitempty"`
	Hidden        int `json:"hidden"`
	Heads         int `json:"heads"`
	// KVHeads is the number of key/value heads (grouped-query attention);
	// zero means as many as Heads.
	KVHeads int `json:"kv_heads,omitempty"`
	// HeadDim is the width of one head; zero means Hidden/Heads.
	HeadDim int `json:"head_dim,omitempty"`
	// FFN is the inner width of the MLP (of one expert).
	FFN int `json:"ffn"`
	// Gated MLPs (SwiGLU, GeGLU) have three matrices instead of two.
	Gated bool `json:"gated,omitempty"`
	// Tied input and output embeddings are one matrix.
	Tied  bool `json:"tied,omitempty"`
	Vocab int  `json:"vocab"`
	// Seq is the default sequence length (the training context).
	Seq int `json:"seq"`
	// MaxSeq is the longest context the model supports, when larger than Seq.
	MaxSeq int `json:"max_seq,omitempty"`
	// Experts and ExpertsPerToken describe a mixture of experts MLP.
	Experts         int `json:"experts,omitempty"`
	ExpertsPerToken int `json:"experts_per_token,omitempty"`
	// PublishedParams is the parameter count its authors state.
	PublishedParams float64 `json:"params,omitempty"`
	Source          string  `json:"source"`
}

func (m *Model) headDim() int {
	if m.HeadDim > 0 {
		return m.HeadDim
	}
	if m.Heads > 0 {
		return m.Hidden / m.Heads
	}
	return 0
}

func (m *Model) kvHeads() int {
	if m.KVHeads > 0 {
		return m.KVHeads
	}
	return m.Heads
}

// attnDim is the width of the query (and output projection input).
func (m *Model) attnDim() float64 { return float64(m.Heads * m.headDim()) }

// kvDim is the width of the key (or value) projection.
func (m *Model) kvDim() float64 { return float64(m.kvHeads() * m.headDim()) }

func (m *Model) experts() int {
	if m.Experts > 1 {
		return m.Experts
	}
	return 1
}

func (m *Model) activeExperts() int {
	if m.Experts > 1 {
		if m.ExpertsPerToken > 0 {
			return m.ExpertsPerToken
		}
		return 1
	}
	return 1
}

// attnParams is the matmul parameter count of one attention block.
func (m *Model) attnParams() float64 {
	h := float64(m.Hidden)
	return 2*h*m.attnDim() + 2*h*m.kvDim()
}

// mlpParams is the matmul parameter count of one expert's MLP.
func (m *Model) mlpParams() float64 {
	mats := 2.0
	if m.Gated {
		mats = 3
	}
	return mats * float64(m.Hidden) * float64(m.FFN)
}

// decoderLayerParams counts the parameters of one decoder block: attention
// (plus cross-attention in an encoder-decoder model), every expert's MLP,
// the router and two norms.
func (m *Model) decoderLayerParams() float64 {
	h := float64(m.Hidden)
	p := m.attnParams() + float64(m.experts())*m.mlpParams() + 2*h
	if m.EncoderLayers > 0 {
		p += m.attnParams() + h
	}
	if m.Experts > 1 {
		p += h * float64(m.Experts)
	}
	return p
}

func (m *Model) encoderLayerParams() float64 {
	return m.attnParams() + m.mlpParams() + 2*float64(m.Hidden)
}

// layerParams is the average parameter count of one block, so that
// Layers+EncoderLayers blocks hold all non-embedding parameters.
func (m *Model) layerParams() float64 {
	return m.blockParams() / float64(m.blocks())
}

func (m *Model) blocks() int { return m.Layers + m.EncoderLayers }

func (m *Model) blockParams() float64 {
	return float64(m.Layers)*m.decoderLayerParams() + float64(m.EncoderLayers)*m.encoderLayerParams()
}

// embeddingParams counts the input embedding and, when not tied, the
// output projection.
func (m *Model) embeddingParams() float64 {
	e := float64(m.Vocab) * float64(m.Hidden)
	if !m.Tied {
		e *= 2
	}
	return e
}

// Params is kiln's count of the model's parameters.
func (m *Model) Params() float64 { return m.blockParams() + m.embeddingParams() }

// ActiveParams counts the parameters one token passes through (all of them
// unless the model is a mixture of experts).
func (m *Model) ActiveParams() float64 {
	if m.Experts <= 1 {
		return m.Params()
	}
	inactive := float64(m.Layers) * float64(m.Experts-m.activeExperts()) * m.mlpParams()
	return m.Params() - inactive
}

// Validate says what makes a model unusable.
func (m *Model) Validate() error {
	var bad []string
	if m.Layers <= 0 {
		bad = append(bad, "layers")
	}
	if m.Hidden <= 0 {
		bad = append(bad, "hidden size")
	}
	if m.Heads <= 0 {
		bad = append(bad, "attention heads")
	}
	if m.FFN <= 0 {
		bad = append(bad, "MLP width")
	}
	if m.Vocab < 0 || m.Seq < 0 || m.KVHeads < 0 || m.HeadDim < 0 || m.EncoderLayers < 0 || m.Experts < 0 || m.ExpertsPerToken < 0 {
		bad = append(bad, "a negative size")
	}
	if len(bad) > 0 {
		return fmt.Errorf("model %q: missing or invalid %s", m.Name, strings.Join(bad, ", "))
	}
	if m.headDim() <= 0 {
		return fmt.Errorf("model %q: hidden size %d is smaller than its %d heads", m.Name, m.Hidden, m.Heads)
	}
	if m.KVHeads > 0 && m.Heads%m.KVHeads != 0 {
		return fmt.Errorf("model %q: %d attention heads do not divide into %d key/value heads", m.Name, m.Heads, m.KVHeads)
	}
	if m.ExpertsPerToken > m.experts() && m.Experts > 1 {
		return fmt.Errorf("model %q: %d experts per token of only %d experts", m.Name, m.ExpertsPerToken, m.Experts)
	}
	return nil
}

//go:embed data/models.yaml
var modelsYAML []byte

var (
	catalogOnce sync.Once
	catalog     []Model
	catalogErr  error
)

// Models returns the embedded model catalog.
func Models() ([]Model, error) {
	catalogOnce.Do(func() {
		var doc struct {
			Rows []Model `json:"rows"`
		}
		if err := yaml.Unmarshal(modelsYAML, &doc); err != nil {
			catalogErr = fmt.Errorf("plan: models.yaml: %w", err)
			return
		}
		for i := range doc.Rows {
			m := &doc.Rows[i]
			if m.Source == "" {
				catalogErr = fmt.Errorf("plan: models.yaml: row %q has no source", m.Name)
				return
			}
			if err := m.Validate(); err != nil {
				catalogErr = fmt.Errorf("plan: models.yaml: %w", err)
				return
			}
		}
		catalog = doc.Rows
	})
	return catalog, catalogErr
}

// ModelByName finds a catalog model by name or alias, ignoring case.
func ModelByName(name string) (Model, bool) {
	ms, err := Models()
	if err != nil {
		return Model{}, false
	}
	n := normName(name)
	for _, m := range ms {
		if normName(m.Name) == n {
			return m, true
		}
		for _, a := range m.Aliases {
			if normName(a) == n {
				return m, true
			}
		}
	}
	return Model{}, false
}

func normName(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	if i := strings.LastIndex(s, "/"); i >= 0 {
		s = s[i+1:]
	}
	return strings.NewReplacer("_", "-", " ", "-").Replace(s)
}

// ModelNames lists the catalog's names.
func ModelNames() []string {
	ms, _ := Models()
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}
