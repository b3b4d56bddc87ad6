package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"kiln.dev/kiln/api"
)

// Identity is what an agent keeps after joining: its node name, its key
// and certificate, the server's URL and CA.
type Identity struct {
	Server string `json:"server"`
	Node   string `json:"node"`
	CAPEM  string `json:"ca_pem"`
	Cert   tls.Certificate
}

// Join asks the server at url for a certificate for node, with a join
// token. The server's CA must have the given SHA-256 fingerprint (from the
// join command): that is the pin, and no other trust is needed. The
// identity is written to dir.
func Join(ctx context.Context, url, token, caSHA256, node, dir string) (*Identity, error) {
	if caSHA256 == "" {
		return nil, errors.New("join: the server CA fingerprint (--ca-sha256) is required: it is in the join command the server printed")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	csrDER, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: node}}, key)
	if err != nil {
		return nil, err
	}
	var seenCA []byte
	tr := &http.Transport{TLSClientConfig: api.FingerprintTLS(caSHA256, &seenCA)}
	defer tr.CloseIdleConnections()
	c := &api.Client{Base: strings.TrimRight(url, "/"), HTTP: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
	req := api.JoinRequest{Token: token, Node: node, CSRPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csrDER}))}
	resp, err := c.Join(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("joining %s: %w", url, err)
	}
	if b, _ := pem.Decode([]byte(resp.CAPEM)); b == nil || api.Fingerprint(b.Bytes) != strings.ToLower(strings.ReplaceAll(caSHA256, ":", "")) {
		return nil, errors.New("joining: the server answered with a CA other than the pinned one")
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	cert, err := tls.X509KeyPair([]byte(resp.CertPEM), keyPEM)
	if err != nil {
		return nil, fmt.Errorf("joining: certificate from the server: %w", err)
	}
	id := &Identity{Server: c.Base, Node: resp.Node, CAPEM: resp.CAPEM, Cert: cert}
	if dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		files := map[string][]byte{"key.pem": keyPEM, "cert.pem": []byte(resp.CertPEM), "ca.pem": []byte(resp.CAPEM)}
		meta, _ := json.MarshalIndent(map[string]string{"server": id.Server, "node": id.Node}, "", "  ")
		files["agent.json"] = append(meta, '\n')
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				return nil, err
			}
		}
	}
	return id, nil
}

// LoadIdentity reads what Join wrote to dir.
func LoadIdentity(dir string) (*Identity, error) {
	meta, err := os.ReadFile(filepath.Join(dir, "agent.json"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s: this node has not joined a server yet (run the 'kiln join' command the server printed)", dir)
		}
		return nil, err
	}
	// The key signs as this node: the directory and the files are the
	// agent's alone, also when they were made wider since.
	if err := private(dir); err != nil {
		return nil, err
	}
	id := &Identity{}
	if err := json.Unmarshal(meta, id); err != nil {
		return nil, fmt.Errorf("%s/agent.json: %w", dir, err)
	}
	ca, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		return nil, err
	}
	id.CAPEM = string(ca)
	id.Cert, err = tls.LoadX509KeyPair(filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return id, nil
}

// private makes the identity directory 0700 and its files 0600.
func private(dir string) error {
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	for _, name := range []string{"key.pem", "cert.pem", "ca.pem", "agent.json"} {
		p := filepath.Join(dir, name)
		st, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if st.Mode()&os.ModeSymlink != 0 {
			return fmt.Errorf("%s is a symbolic link: the agent keeps its identity in plain files", p)
		}
		if st.Mode().Perm() != 0o600 {
			if err := os.Chmod(p, 0o600); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
		}
	}
	return nil
}

// Client is an API client authenticated as this node.
func (id *Identity) Client() (*api.Client, error) {
	return api.NewClient(id.Server, "", []byte(id.CAPEM), &id.Cert)
}
