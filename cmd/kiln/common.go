package main

import (
	"errors"
	"os"
	"path/filepath"

	"kiln.dev/kiln/api"
)

// apiErr turns an API error into an exit error: 2 for a refusal by the
// server (4xx), 3 when it could not be asked.
func apiErr(err error) error {
	if err == nil {
		return nil
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return err
	}
	if s := api.StatusOf(err); s >= 400 && s < 500 {
		return &exitError{code: 2, err: err}
	}
	return &exitError{code: 3, err: err}
}

// defaultDataDir is $KILN_DATA, else $XDG_DATA_HOME/kiln, else
// ~/.local/share/kiln.
func defaultDataDir() string {
	if d := os.Getenv("KILN_DATA"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "kiln")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "share", "kiln")
	}
	return ".kiln"
}
