package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"kiln.dev/kiln/api"
)

// kiln serve's wait shows the engine's latest log line (a model's pull,
// its loading): followLatest keeps it from the followed log.
func TestFollowLatest(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/jobs/j-1/logs" || r.URL.Query().Get("follow") == "" {
			http.NotFound(w, r)
			return
		}
		io.WriteString(w, "kiln: pulling the model reg/m@sha256:aa into the node's cache\nkiln: model reg/m@sha256:aa: 512 of 1024 MiB\n\n")
	}))
	defer srv.Close()
	var latest atomic.Value
	latest.Store("")
	followLatest(context.Background(), &api.Client{Base: srv.URL, HTTP: srv.Client()}, "j-1", &latest)
	if got := latest.Load().(string); got != "kiln: model reg/m@sha256:aa: 512 of 1024 MiB" {
		t.Errorf("latest line %q", got)
	}
}
