package serving

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// CustomName is the engine name of a user's own image or command.
const CustomName = "custom"

// CustomEngine is the user's engine: their image (image set) or a command
// run on the node as a process (image ""), serving the model's format on
// port, ready when ready answers 200. Its command may hold the catalogue's
// placeholders.
func CustomEngine(format, image string, command []string, port int, ready string) (*Engine, error) {
	if format != FormatSafetensors && format != FormatGGUF {
		return nil, fmt.Errorf("format %q: want %s or %s", format, FormatSafetensors, FormatGGUF)
	}
	if image == "" && len(command) == 0 {
		return nil, errors.New("a custom engine needs an image (--image) or a command (--command)")
	}
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %d: the engine's port must be 1 to 65535 (--port)", port)
	}
	if !strings.HasPrefix(ready, "/") {
		return nil, fmt.Errorf("readiness path %q must start with / (--ready)", ready)
	}
	e := &Engine{Name: CustomName, Formats: []string{format}, TensorParallel: true, Port: port, Ready: ready,
		Command: append([]string(nil), command...), Source: "the user's"}
	if image != "" {
		e.Images = []Image{{Ref: image, Source: "the user's"}}
	}
	if _, err := e.Args(Values{Model: "/m", ModelFile: "/m/f", Name: "n", Port: port, TP: 1, Context: 1}); err != nil {
		return nil, err
	}
	return e, nil
}

// Values fill an engine's command.
type Values struct {
	// Model is the model's folder (or its one file, for GGUF), as the
	// engine sees it; ModelFile its weights file when it is one file.
	Model, ModelFile string
	// Name is what clients ask for in the request's model field.
	Name    string
	Port    int
	TP      int
	Context int
}

var placeholder = regexp.MustCompile(`\{[a-z_]*\}`)

// Args is the engine's command with its placeholders filled; a word in
// braces kiln does not know is an error, not passed on.
func (e Engine) Args(v Values) ([]string, error) {
	fill := map[string]string{
		"{model}":      v.Model,
		"{model_file}": v.ModelFile,
		"{name}":       v.Name,
		"{port}":       strconv.Itoa(v.Port),
		"{tp}":         strconv.Itoa(v.TP),
		"{context}":    strconv.Itoa(v.Context),
	}
	out := make([]string, len(e.Command))
	var bad error
	for i, w := range e.Command {
		out[i] = placeholder.ReplaceAllStringFunc(w, func(p string) string {
			f, ok := fill[p]
			if !ok && bad == nil {
				bad = fmt.Errorf("engine %s: command word %q holds %s, which kiln does not fill (it fills {model}, {model_file}, {name}, {port}, {tp} and {context})", e.Name, w, p)
			}
			return f
		})
	}
	if bad != nil {
		return nil, bad
	}
	return out, nil
}

// validServedName: what a deployment is asked for by in the OpenAI API's
// model field, and named by in kiln serve ls and stop.
var validServedName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$`)

// CheckName says whether name can name a deployment: 1 to 128 letters,
// digits, '.', '_', ':', '/' or '-', starting with a letter or digit.
func CheckName(name string) error {
	if !validServedName.MatchString(name) || strings.Contains(name, "..") {
		return fmt.Errorf("deployment name %q: want 1 to 128 letters, digits, '.', '_', ':', '/' or '-', starting with a letter or digit", name)
	}
	return nil
}

// DefaultName is the deployment name kiln gives a model: its own name,
// lowercased, with what CheckName refuses replaced by '-'.
func DefaultName(model string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(model) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	n := strings.Trim(b.String(), "-.")
	for strings.Contains(n, "..") {
		n = strings.ReplaceAll(n, "..", ".")
	}
	if len(n) > 128 {
		n = n[:128]
	}
	if n == "" {
		n = "model"
	}
	return n
}
