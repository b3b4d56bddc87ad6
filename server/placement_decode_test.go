package server

import (
	"strings"
	"testing"
)

// TestPlacementRequests: placement scheduler is taken only where the
// kube-scheduler can pick (whole GPUs on one node, a job with an image),
// and every refusal says what to do instead.
func TestPlacementRequests(t *testing.T) {
	for body, want := range map[string]string{
		`{"gpus":2,"placement":"scheduler","job":{"image":"reg/x:1"}}`:       "",
		`{"gpus":2,"placement":"kiln"}`:                                      "",
		`{"gpus":2}`:                                                         "",
		`{"gpus":2,"placement":"kube"}`:                                      "want kiln",
		`{"fraction":0.5,"placement":"scheduler","job":{"image":"reg/x:1"}}`: "whole GPUs",
		`{"gpus":2,"placement":"scheduler","constraints":{"gang":true},"job":{"image":"reg/x:1"}}`:               "one node",
		`{"gpus":2,"placement":"scheduler","constraints":{"same_nvlink_island":true},"job":{"image":"reg/x:1"}}`: "NVLink",
		`{"gpus":2,"placement":"scheduler"}`:                             "kiln run --image",
		`{"gpus":2,"placement":"scheduler","job":{"command":["train"]}}`: "with an image",
	} {
		_, err := parseLeaseRequest([]byte(body))
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: refused: %v", body, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: %v, want a refusal saying %q", body, err, want)
		}
	}
}
