package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"kiln.dev/kiln/compat"
	"kiln.dev/kiln/server"
)

// catalog is kiln compat's cache as the server sees it.
type catalog struct {
	imgs  []compat.Checked
	err   error
	calls atomic.Int32
}

func (c *catalog) CheckedImages(context.Context) ([]compat.Checked, error) {
	c.calls.Add(1)
	return c.imgs, c.err
}

// The fleet view names the nodes where an image kiln compat read cannot
// run, with the reason on each; a catalog that fails leaves the image
// findings out and the page works.
func TestFleetImageFindings(t *testing.T) {
	cat := &catalog{imgs: []compat.Checked{{Ref: "lab/cuda13:1", Platform: "linux/amd64",
		Requirements: &compat.Requirements{CUDA: "13.0", CUDAFrom: "CUDA_VERSION"}}}}
	c := newCluster(t, server.Config{CheckedImages: cat})
	ms := machines(t)
	c.addAgent("hgx", ms["hgx"], nil, 0)
	c.addAgent("mi300x", ms["mi300x"], nil, 0)
	c.waitNodes(2)
	link, err := c.admin.UILink(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	hc := c.browserClient(t)
	if resp, err := hc.Get(link.URL); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("sign-in: %v %v", err, status(resp))
	}
	fleet := func() []map[string]any {
		t.Helper()
		resp, err := hc.Get(c.url + "/ui/api/fleet")
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("fleet: %v %v", err, status(resp))
		}
		defer resp.Body.Close()
		var v struct {
			FleetFindings []map[string]any `json:"fleet_findings"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			t.Fatal(err)
		}
		return v.FleetFindings
	}
	var fails map[string]any
	for _, f := range fleet() {
		if f["id"] == "fleet-image-fails" {
			fails = f
		}
	}
	if fails == nil {
		t.Fatalf("no fleet-image-fails finding for a CUDA 13 image on a CUDA 12 driver and an AMD node")
	}
	title, _ := fails["title"].(string)
	nodes, _ := fails["nodes"].(string)
	ev, _ := json.Marshal(fails["evidence"])
	t.Logf("%s on %s: %s; fix: %v", title, nodes, ev, fails["remedy"])
	if !strings.Contains(title, "lab/cuda13:1 (linux/amd64) cannot run on") || !strings.Contains(nodes, "hgx") || !strings.Contains(string(ev), "hgx, driver") {
		t.Errorf("finding %q on %q, evidence %s", title, nodes, ev)
	}
	cat.err, cat.imgs = errors.New("cache unreadable"), nil
	for _, f := range fleet() {
		if strings.HasPrefix(f["id"].(string), "fleet-image") {
			t.Errorf("a failing catalog gave %v", f)
		}
	}
	if cat.calls.Load() < 2 {
		t.Errorf("the catalog was asked %d times", cat.calls.Load())
	}
}
