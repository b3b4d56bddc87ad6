package cdi

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	rspec "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// Directories CDI runtimes read specs from: /etc/cdi for specs an admin
// keeps, /var/run/cdi for specs a daemon regenerates at boot. kiln writes
// to /var/run/cdi by default, since the devices it describes are found
// again at every start.
const (
	StaticDir  = "/etc/cdi"
	DynamicDir = "/var/run/cdi"
)

// DefaultDirs are the directories runtimes search, lowest priority first.
var DefaultDirs = []string{StaticDir, DynamicDir}

// SpecFile is the file name kiln's spec gets in a CDI directory.
const SpecFile = "kiln.dev-gpu.json"

// Write validates spec and writes it atomically as dir/kiln.dev-gpu.json
// (dir is created when missing; "" means DynamicDir). It returns the file
// written.
func Write(spec *cdispec.Spec, dir string) (string, error) {
	if spec == nil {
		return "", errors.New("cdi: no spec to write")
	}
	if dir == "" {
		dir = DynamicDir
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return "", fmt.Errorf("cdi: %s: %w", dir, err)
	}
	if err := cache.WriteSpec(spec, SpecFile); err != nil {
		return "", fmt.Errorf("cdi: writing %s: %w", filepath.Join(dir, SpecFile), err)
	}
	p := filepath.Join(dir, SpecFile)
	// Runtimes that do not run as root (podman rootless) read it too.
	if err := os.Chmod(p, 0o644); err != nil {
		return p, fmt.Errorf("cdi: %w", err)
	}
	return p, nil
}

// Inject applies the named CDI devices ("kiln.dev/gpu=0") found in dirs
// (nil means DefaultDirs) to an OCI runtime spec: device nodes, cgroup
// device rules, mounts, environment.
func Inject(oci *rspec.Spec, dirs []string, devices ...string) error {
	if len(devices) == 0 {
		return nil
	}
	if oci == nil {
		return errors.New("cdi: no OCI spec to inject devices into")
	}
	if dirs == nil {
		dirs = DefaultDirs
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dirs...), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return fmt.Errorf("cdi: %w", err)
	}
	unresolved, err := cache.InjectDevices(oci, devices...)
	if err == nil {
		return nil
	}
	if len(unresolved) > 0 {
		msg := fmt.Sprintf("cdi: no such device %s in %s", strings.Join(unresolved, ", "), strings.Join(dirs, ", "))
		var problems []string
		for path, errs := range cache.GetErrors() {
			for _, e := range errs {
				problems = append(problems, fmt.Sprintf("%s: %v", path, e))
			}
		}
		if len(problems) > 0 {
			msg += " (specs with errors: " + strings.Join(problems, "; ") + ")"
		}
		return errors.New(msg)
	}
	return fmt.Errorf("cdi: injecting %s: %w", strings.Join(devices, ", "), err)
}
