// Package serving chooses how to serve a model: which engine and image from
// kiln's engine catalogue (embedded data), on which node, with how many
// GPUs. It is a pure function of the model's description, the nodes'
// Snapshots, the knowledge base and what kiln compat read of images: the
// image's verdict on each node comes from compat, the size from plan, and
// tensor parallelism stays inside one NVLink or xGMI island of topo's
// matrix.
package serving

import (
	_ "embed"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

//go:embed data/engines.yaml
var enginesYAML []byte

// Catalogue is the engines kiln serve knows.
type Catalogue struct {
	Engines []Engine `json:"engines"`
}

// Engine is one inference engine.
type Engine struct {
	Name string `json:"name"`
	// Formats are the weight formats it serves: safetensors, gguf.
	Formats []string `json:"formats"`
	// TensorParallel says it shards a model over several GPUs by tensor
	// parallelism; an engine without it is given one GPU.
	TensorParallel bool     `json:"tensor_parallel"`
	Port           int      `json:"port"`
	Ready          string   `json:"ready"`
	Command        []string `json:"command"`
	Images         []Image  `json:"images"`
	Source         string   `json:"source"`
}

// Image is one build of an engine.
type Image struct {
	Ref string `json:"ref"`
	// Vendor is nvidia or amd.
	Vendor string `json:"vendor"`
	// CUDA or ROCm is the major.minor line its build declares.
	CUDA   string `json:"cuda,omitempty"`
	ROCm   string `json:"rocm,omitempty"`
	Source string `json:"source"`
}

// Formats kiln serve tells apart.
const (
	FormatSafetensors = "safetensors"
	FormatGGUF        = "gguf"
)

// Default is the embedded catalogue.
func Default() (*Catalogue, error) { return ParseCatalogue(enginesYAML) }

// ParseCatalogue reads and checks a catalogue: every engine named once,
// with formats kiln knows, a port, a readiness path, a command and images;
// every image with a vendor, its CUDA or ROCm line and a source.
func ParseCatalogue(b []byte) (*Catalogue, error) {
	var c Catalogue
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		return nil, fmt.Errorf("engine catalogue: %w", err)
	}
	if len(c.Engines) == 0 {
		return nil, fmt.Errorf("engine catalogue: no engine")
	}
	seen := map[string]bool{}
	for _, e := range c.Engines {
		switch {
		case e.Name == "" || seen[e.Name]:
			return nil, fmt.Errorf("engine catalogue: engine %q is unnamed or named twice", e.Name)
		case len(e.Formats) == 0:
			return nil, fmt.Errorf("engine catalogue: %s serves no format", e.Name)
		case e.Port < 1 || e.Port > 65535:
			return nil, fmt.Errorf("engine catalogue: %s: port %d", e.Name, e.Port)
		case !strings.HasPrefix(e.Ready, "/"):
			return nil, fmt.Errorf("engine catalogue: %s: readiness path %q does not start with /", e.Name, e.Ready)
		case len(e.Command) == 0 || len(e.Images) == 0 || e.Source == "":
			return nil, fmt.Errorf("engine catalogue: %s needs a command, images and a source", e.Name)
		}
		seen[e.Name] = true
		for _, f := range e.Formats {
			if f != FormatSafetensors && f != FormatGGUF {
				return nil, fmt.Errorf("engine catalogue: %s: format %q (want %s or %s)", e.Name, f, FormatSafetensors, FormatGGUF)
			}
		}
		for _, im := range e.Images {
			switch {
			case im.Ref == "" || im.Source == "":
				return nil, fmt.Errorf("engine catalogue: %s: an image without a reference or a source", e.Name)
			case im.Vendor == "nvidia" && (im.CUDA == "" || im.ROCm != ""):
				return nil, fmt.Errorf("engine catalogue: %s: NVIDIA image %s needs its CUDA line and no ROCm one", e.Name, im.Ref)
			case im.Vendor == "amd" && (im.ROCm == "" || im.CUDA != ""):
				return nil, fmt.Errorf("engine catalogue: %s: AMD image %s needs its ROCm line and no CUDA one", e.Name, im.Ref)
			case im.Vendor != "nvidia" && im.Vendor != "amd":
				return nil, fmt.Errorf("engine catalogue: %s: image %s of vendor %q (want nvidia or amd)", e.Name, im.Ref, im.Vendor)
			}
		}
	}
	return &c, nil
}

// Engine finds an engine by name.
func (c *Catalogue) Engine(name string) (Engine, bool) {
	i := slices.IndexFunc(c.Engines, func(e Engine) bool { return e.Name == name })
	if i < 0 {
		return Engine{}, false
	}
	return c.Engines[i], true
}
