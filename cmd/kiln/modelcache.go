package main

import (
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/agent"
	"kiln.dev/kiln/serving/modelstore"
)

// modelCacheFlags are where an agent keeps the models of the lab's
// registry its jobs need.
type modelCacheFlags struct {
	dir        string
	gib        int64
	insecure   bool
	registries []string
}

func (f *modelCacheFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.dir, "model-cache", defaultModelCache(), "where the node keeps the models of the lab's registry its jobs need (kiln serve REGISTRY/REPO:TAG); jobs read it, so not under kiln's data directory")
	fl.Int64Var(&f.gib, "model-cache-gib", 200, "the model cache's bound in GiB: the least recently used models not in use are evicted past it (0: no bound)")
	fl.StringSliceVar(&f.registries, "model-registry", nil, "a registry (host[:port]) the node pulls jobs' models from, the lab's (repeatable); a model elsewhere is refused")
	fl.BoolVar(&f.insecure, "model-registry-insecure", false, "allow plain HTTP to the model registry (loopback and private addresses get it without asking)")
}

// defaultModelCache is /var/cache/kiln/models for root, else the user's
// cache directory: outside kiln's data directory, which jobs do not see.
func defaultModelCache() string {
	if os.Geteuid() == 0 {
		return "/var/cache/kiln/models"
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "kiln", "models")
	}
	return ""
}

// puller is the agent's ModelPuller; nil without a directory.
func (f *modelCacheFlags) puller() agent.ModelPuller {
	if f.dir == "" {
		return nil
	}
	return &modelstore.Cache{Root: f.dir, MaxBytes: f.gib << 30, Registries: f.registries, Options: modelstore.Options{Insecure: f.insecure}}
}
