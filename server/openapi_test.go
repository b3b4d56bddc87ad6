package server

import (
	"sort"
	"strings"
	"testing"

	"kiln.dev/kiln/api"

	"sigs.k8s.io/yaml"
)

// TestOpenAPIMatchesRoutes: openapi.yaml lists exactly the routes the
// server serves, each with the authentication it really needs.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	b, err := api.OpenAPI, error(nil)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		OpenAPI string                    `json:"openapi"`
		Paths   map[string]map[string]any `json:"paths"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Errorf("openapi %q, want 3.x", doc.OpenAPI)
	}
	documented := map[string]string{}
	for path, ops := range doc.Paths {
		for method, v := range ops {
			op, ok := v.(map[string]any) // not the path's own parameters, summary...
			if !ok || method == "parameters" {
				continue
			}
			auth, _ := op["x-kiln-auth"].(string)
			documented[strings.ToUpper(method)+" "+path] = auth
		}
	}
	s := &Server{}
	served := map[string]string{}
	for _, r := range s.routes() {
		// OpenAPI has no path parameter that holds slashes: {path...}
		// is written {path} there.
		served[r.method+" "+strings.ReplaceAll(r.path, "...}", "}")] = r.auth
	}
	var missing, extra []string
	for k, auth := range served {
		d, ok := documented[k]
		if !ok {
			missing = append(missing, k)
		} else if d != auth {
			t.Errorf("%s: openapi.yaml says auth %q, the server needs %q", k, d, auth)
		}
	}
	for k := range documented {
		if _, ok := served[k]; !ok {
			extra = append(extra, k)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 {
		t.Errorf("served but not in openapi.yaml: %v", missing)
	}
	if len(extra) > 0 {
		t.Errorf("in openapi.yaml but not served: %v", extra)
	}
	if len(served) < 20 {
		t.Errorf("only %d routes: the table is incomplete", len(served))
	}
}
