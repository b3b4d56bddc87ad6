package cdi

import (
	"encoding/json"
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

// Validate checks a spec the way a CDI runtime does when it loads it:
// version, kind, device names, device nodes, mounts.
func Validate(spec *cdispec.Spec) error {
	if spec == nil {
		return errors.New("cdi: no spec")
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("cdi: encoding spec: %w", err)
	}
	dir, err := os.MkdirTemp("", "kiln-cdi-*")
	if err != nil {
		return fmt.Errorf("cdi: validating spec: %w", err)
	}
	defer os.RemoveAll(dir)
	p := filepath.Join(dir, SpecFile)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		return fmt.Errorf("cdi: validating spec: %w", err)
	}
	if _, err := cdiapi.ReadSpec(p, 0); err != nil {
		return fmt.Errorf("cdi: spec %s is not valid: %w", spec.Kind, unwrapPath(err, p))
	}
	return nil
}

// unwrapPath drops the temporary file name from a validation message.
func unwrapPath(err error, p string) error {
	return errors.New(strings.ReplaceAll(err.Error(), fmt.Sprintf("%q", p), "kiln's spec"))
}

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

// Remove deletes kiln's spec from dir ("" means DynamicDir); a missing
// spec is not an error.
func Remove(dir string) error {
	if dir == "" {
		dir = DynamicDir
	}
	err := os.Remove(filepath.Join(dir, SpecFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cdi: %w", err)
	}
	return nil
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
