package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// ClientConfig is what the CLI needs to reach a server: its URL, a token
// and the server's CA (pinned). kiln up and kiln server write one.
type ClientConfig struct {
	Server string `json:"server"`
	Token  string `json:"token"`
	CAPEM  string `json:"ca_pem"`
	// Project is the default project for leases.
	Project string `json:"project,omitempty"`
}

// DefaultConfigPath is $KILN_CONFIG, else $XDG_CONFIG_HOME/kiln/client.json,
// else ~/.config/kiln/client.json.
func DefaultConfigPath() string {
	if p := os.Getenv("KILN_CONFIG"); p != "" {
		return p
	}
	if d := os.Getenv("XDG_CONFIG_HOME"); d != "" {
		return filepath.Join(d, "kiln", "client.json")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(".kiln", "client.json")
	}
	return filepath.Join(home, ".config", "kiln", "client.json")
}

// LoadClientConfig reads a client configuration file.
func LoadClientConfig(path string) (*ClientConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s: no client configuration (start a server with 'kiln up', or pass --server and --token): %w", path, err)
		}
		return nil, err
	}
	var c ClientConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &c, nil
}

// Save writes the configuration with mode 0600.
func (c *ClientConfig) Save(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Client returns a client for the configuration.
func (c *ClientConfig) Client() (*Client, error) {
	return NewClient(c.Server, c.Token, []byte(c.CAPEM), nil)
}
