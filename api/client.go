package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Client calls a kiln server.
type Client struct {
	// Base is the server's URL, "https://host:7443".
	Base  string
	Token string
	HTTP  *http.Client
}

// NewClient returns a client that trusts only the CA in caPEM and, when
// cert is set, presents it (agents).
func NewClient(base, token string, caPEM []byte, cert *tls.Certificate) (*Client, error) {
	tc, err := PinnedTLS(caPEM)
	if err != nil {
		return nil, err
	}
	if cert != nil {
		tc.Certificates = []tls.Certificate{*cert}
	}
	tr := &http.Transport{TLSClientConfig: tc, MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second, ForceAttemptHTTP2: true,
		// Tunnels (kiln forward) carry bulk bytes: frames and windows
		// larger than the defaults.
		HTTP2: &http.HTTP2Config{MaxReadFrameSize: 1 << 20, MaxReceiveBufferPerStream: 4 << 20, MaxReceiveBufferPerConnection: 8 << 20}}
	return &Client{Base: strings.TrimRight(base, "/"), Token: token, HTTP: &http.Client{Transport: tr}}, nil
}

// PinnedTLS trusts only the CA certificate in caPEM.
func PinnedTLS(caPEM []byte) (*tls.Config, error) {
	pool := x509.NewCertPool()
	if len(caPEM) > 0 && !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("server CA: no PEM certificate found")
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// FingerprintTLS accepts a server whose chain ends in a CA certificate with
// the given SHA-256 fingerprint (hex), so a joining agent needs nothing but
// the join command. The CA certificate seen is stored in *seen.
func FingerprintTLS(fingerprint string, seen *[]byte) *tls.Config {
	want := strings.ToLower(strings.ReplaceAll(fingerprint, ":", ""))
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // the chain is verified below against the pinned CA
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("server sent no certificate")
			}
			for _, der := range raw[1:] {
				if Fingerprint(der) != want {
					continue
				}
				ca, err := x509.ParseCertificate(der)
				if err != nil {
					return err
				}
				leaf, err := x509.ParseCertificate(raw[0])
				if err != nil {
					return err
				}
				pool := x509.NewCertPool()
				pool.AddCert(ca)
				if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool}); err != nil {
					return fmt.Errorf("server certificate not signed by the pinned CA: %w", err)
				}
				if seen != nil {
					*seen = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
				}
				return nil
			}
			return fmt.Errorf("server CA does not match the pinned fingerprint %s", want)
		},
	}
}

// Fingerprint is the SHA-256 of a DER certificate, in hex.
func Fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// Do sends in as JSON (when not nil) and decodes the answer into out (when
// not nil). A non-2xx answer is returned as *Error. path is sent as it is:
// the typed methods (CreateLease, GetNode, ...) build it from ids safely.
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	resp, err := c.Raw(ctx, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	return nil
}

// Raw sends a request (body, when not nil, as JSON) and returns the
// response when it is 2xx; else the error message the server gave, as
// *Error.
func (c *Client) Raw(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	return c.send(ctx, method, path, "application/json", body)
}

// send is Raw with the body's content type.
func (c *Client) send(ctx context.Context, method, path, contentType string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.Base+path, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &Error{Status: resp.StatusCode}
	if json.Unmarshal(b, e) != nil || e.Message == "" {
		e.Message = fmt.Sprintf("%s %s: %s", method, path, strings.TrimSpace(string(b)))
		if strings.TrimSpace(string(b)) == "" {
			e.Message = fmt.Sprintf("%s %s: %s", method, path, resp.Status)
		}
	}
	return nil, e
}

// StatusOf returns the HTTP status of an *Error, 0 for other errors.
func StatusOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}
