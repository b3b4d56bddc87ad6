package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --token-file is read each time a node joins, so a renewed token is the
// one used; a file that holds no token is refused, not sent.
func TestAgentsJoinTokenFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "join-token")
	f := &agentsFlags{tokenFile: path, token: "ignored"}
	if _, err := f.joinToken(); err == nil {
		t.Error("a missing token file gave a token")
	}
	for content, want := range map[string]string{
		"kiln_join_a_b\n":               "kiln_join_a_b",
		"  kiln_join_c\r\n":             "kiln_join_c",
		"":                              "",
		"kiln_join_a kiln_join_b\n":     "",
		strings.Repeat("x", 600) + "\n": "",
	} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := f.joinToken()
		if want == "" {
			if err == nil {
				t.Errorf("token file %q gave %q, want a refusal", content, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("token file %q: %q %v, want %q", content, got, err, want)
		}
	}
	f = &agentsFlags{token: "kiln_join_flag"}
	if got, err := f.joinToken(); err != nil || got != "kiln_join_flag" {
		t.Errorf("--token: %q %v", got, err)
	}
	if _, err := (&agentsFlags{}).joinToken(); err == nil {
		t.Error("no token at all gave one")
	}
}
