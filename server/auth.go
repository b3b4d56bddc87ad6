package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/store"
)

// Tokens are "kiln_<id>_<secret>" (API) and "kjoin_<id>_<secret>" (join);
// only SHA-256 of the secret is stored. Secrets are 32 random bytes, so a
// plain hash is enough: there is nothing to guess.
const (
	apiTokenPrefix  = "kiln_"
	joinTokenPrefix = "kjoin_"
)

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func newSecret() (secret string, hash []byte) {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	secret = base64.RawURLEncoding.EncodeToString(b)
	h := sha256.Sum256([]byte(secret))
	return secret, h[:]
}

// splitToken reads "<prefix><id>_<secret>".
func splitToken(tok, prefix string) (id, secret string, ok bool) {
	rest, found := strings.CutPrefix(tok, prefix)
	if !found {
		return "", "", false
	}
	id, secret, ok = strings.Cut(rest, "_")
	if !ok || id == "" || secret == "" || len(id) > 64 || len(secret) > 128 {
		return "", "", false
	}
	return id, secret, true
}

func hashMatches(secret string, hash []byte) bool {
	h := sha256.Sum256([]byte(secret))
	return subtle.ConstantTimeCompare(h[:], hash) == 1
}

// caller is who makes a request: a user (token) or an agent (certificate).
type caller struct {
	user  *userInfo
	token string // the id of the token the user called with
	node  string
}

func (c *caller) admin() bool { return c.user != nil && c.user.Role == api.RoleAdmin }

// canSee reports whether the caller may see and act on a project's leases.
func (c *caller) canSee(project string) bool {
	return c.admin() || (c.user != nil && c.user.projects[project])
}

type ctxKey struct{}

func withCaller(r *http.Request, c *caller) context.Context {
	return context.WithValue(r.Context(), ctxKey{}, c)
}

func callerOf(r *http.Request) *caller {
	c, _ := r.Context().Value(ctxKey{}).(*caller)
	if c == nil {
		return &caller{}
	}
	return c
}

// authenticate finds the caller from the bearer token or the client
// certificate; nil when neither is valid.
// tokenUser is the user of token id while the token lives; s.amu is held.
func (s *Server) tokenUser(id string, now time.Time) *userInfo {
	t := s.tokens[id]
	if t == nil || (!t.Expires.IsZero() && now.After(t.Expires)) {
		return nil
	}
	return s.users[t.UserID]
}

func (s *Server) authenticate(r *http.Request) *caller {
	if h := r.Header.Get("Authorization"); h != "" {
		tok, ok := strings.CutPrefix(h, "Bearer ")
		if !ok {
			return nil
		}
		id, secret, ok := splitToken(strings.TrimSpace(tok), apiTokenPrefix)
		if !ok {
			return nil
		}
		s.amu.RLock()
		defer s.amu.RUnlock()
		if t := s.tokens[id]; t == nil || !hashMatches(secret, t.Hash) {
			return nil
		}
		if u := s.tokenUser(id, time.Now()); u != nil {
			return &caller{user: u, token: id}
		}
		return nil
	}
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.PeerCertificates) > 0 {
		cert := r.TLS.PeerCertificates[0]
		node := cert.Subject.CommonName
		fp := api.Fingerprint(cert.Raw)
		s.amu.RLock()
		defer s.amu.RUnlock()
		n := s.agents[node]
		// Only the certificate the node last joined with is accepted.
		if n == nil || n.certFP != fp {
			return nil
		}
		return &caller{node: node}
	}
	return nil
}

// bootstrap creates the admin user, its token, the default project and a
// join token on first start.
func (s *Server) bootstrap(ctx context.Context) error {
	if len(s.users) > 0 {
		return nil
	}
	now := time.Now().UTC()
	admin := api.User{ID: "u-" + randHex(6), Name: "admin", Role: api.RoleAdmin, Created: now, Projects: []string{"default"}}
	tokID := randHex(6)
	secret, hash := newSecret()
	def := api.Project{Name: "default", Weight: 1, PeriodSeconds: 30 * 24 * 3600}
	err := s.st.Update(ctx, func(tx *store.Tx) error {
		if err := tx.PutUser(admin); err != nil {
			return err
		}
		if err := tx.PutProject(def); err != nil {
			return err
		}
		if err := tx.AddMember("default", admin.ID); err != nil {
			return err
		}
		if err := tx.PutToken(store.TokenRow{ID: tokID, UserID: admin.ID, Name: "bootstrap", Hash: hash, Created: now}); err != nil {
			return err
		}
		return tx.AddEvent(api.Event{Kind: "server.created", Subject: "server", Message: "first start: admin user and default project created"})
	})
	if err != nil {
		return fmt.Errorf("first start: %w", err)
	}
	s.putUser(admin)
	s.amu.Lock()
	s.tokens[tokID] = &tokenInfo{store.TokenRow{ID: tokID, UserID: admin.ID, Hash: hash, Created: now}}
	s.amu.Unlock()
	s.core.AddProject(now, def)
	jt, err := s.newJoinToken(ctx, defaultJoinTTL, 1, "first start")
	if err != nil {
		return fmt.Errorf("first start: %w", err)
	}
	s.Bootstrap = &Bootstrap{AdminToken: apiTokenPrefix + tokID + "_" + secret, JoinToken: jt.Secret, JoinCommand: jt.Command, JoinExpires: jt.Expires}
	return nil
}

func (s *Server) joinCommand(token string) string {
	u := s.cfg.URL
	if u == "" {
		u = "https://SERVER:7443"
	}
	return fmt.Sprintf("kiln join %s --token %s --ca-sha256 %s", u, token, s.CAFingerprint())
}

// Join tokens are single-use and valid for an hour unless asked otherwise.
const (
	defaultJoinTTL = time.Hour
	maxJoinUses    = 100000
)

// useJoinToken checks a join token and takes one of its uses; s.mu is held
// (two joins cannot race for the last use). The refusal says why.
func (s *Server) useJoinToken(ctx context.Context, tok string, now time.Time) error {
	id, secret, ok := splitToken(tok, joinTokenPrefix)
	if !ok {
		return errors.New("join token: not a kiln join token (kjoin_...)")
	}
	var row store.JoinTokenRow
	used := false
	err := s.st.Update(ctx, func(tx *store.Tx) error {
		var err error
		if row, err = tx.JoinToken(id); err != nil {
			return err
		}
		if !hashMatches(secret, row.Hash) {
			return store.ErrNotFound
		}
		if used, err = tx.UseJoinToken(id, now); err != nil || !used {
			return err
		}
		return tx.AddEvent(api.Event{Kind: "join-token.used", Subject: id, Message: fmt.Sprintf("join token %s used (%d of %d)", id, row.Used+1, row.Uses)})
	})
	switch {
	case errors.Is(err, store.ErrNotFound):
		return errors.New("join token: unknown or wrong")
	case err != nil:
		return storeErr(err)
	case used:
		return nil
	case !row.Revoked.IsZero():
		return fmt.Errorf("join token %s: revoked at %s; make a new one with 'kiln token join'", id, row.Revoked.Format(time.RFC3339))
	case !now.Before(row.Expires):
		return fmt.Errorf("join token %s: expired at %s; make a new one with 'kiln token join'", id, row.Expires.Format(time.RFC3339))
	}
	return fmt.Errorf("join token %s: used up (it joined %d nodes, all it may); make a new one with 'kiln token join' (--uses N for several nodes)", id, row.Used)
}

// newJoinToken makes a join token valid for ttl and uses joins.
func (s *Server) newJoinToken(ctx context.Context, ttl time.Duration, uses int, by string) (api.JoinToken, error) {
	if ttl <= 0 {
		ttl = defaultJoinTTL
	}
	uses = max(uses, 1)
	id := randHex(6)
	secret, hash := newSecret()
	now := time.Now().UTC()
	err := s.st.Update(ctx, func(tx *store.Tx) error {
		if err := tx.PutJoinToken(store.JoinTokenRow{ID: id, Hash: hash, Created: now, Expires: now.Add(ttl), Uses: uses}); err != nil {
			return err
		}
		return tx.AddEvent(api.Event{Kind: "join-token.created", Subject: id, Message: fmt.Sprintf("%s made join token %s for %d nodes, valid until %s", by, id, uses, now.Add(ttl).Format(time.RFC3339))})
	})
	if err != nil {
		return api.JoinToken{}, err
	}
	tok := joinTokenPrefix + id + "_" + secret
	return api.JoinToken{ID: id, Secret: tok, Created: now, Expires: now.Add(ttl), Command: s.joinCommand(tok), Uses: uses}, nil
}

// CreateJoinToken makes a join token for uses nodes (at least one), valid
// for ttl (0: one hour), for callers in the same process (kiln up, the
// Kubernetes backend); by names them in the event log. The API's POST
// /v1/join-tokens does the same.
func (s *Server) CreateJoinToken(ctx context.Context, ttl time.Duration, uses int, by string) (api.JoinToken, error) {
	return s.newJoinToken(ctx, ttl, uses, by)
}
