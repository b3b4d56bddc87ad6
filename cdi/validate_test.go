package cdi

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

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
