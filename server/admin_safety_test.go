package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/server"
)

// TestLastAdminStaysAdmin: the last admin can neither demote itself, nor
// be removed, nor revoke its last token; the refusal says the way out.
func TestLastAdminStaysAdmin(t *testing.T) {
	c := newCluster(t, server.Config{})
	ctx := context.Background()
	wantRefused := func(what string, err error) {
		t.Helper()
		if api.StatusOf(err) != http.StatusConflict {
			t.Fatalf("%s: %v, want 409", what, err)
		}
		if !strings.Contains(err.Error(), "last admin") || !strings.Contains(err.Error(), "--reset-admin") {
			t.Errorf("%s: %q does not say why and the way out", what, err)
		}
	}
	wantRefused("the last admin demoting itself", c.admin.Do(ctx, "POST", "/v1/tokens", api.TokenRequest{User: "admin", Role: api.RoleMember}, nil))
	wantRefused("removing the last admin", c.admin.Do(ctx, "DELETE", "/v1/users/admin", nil, nil))
	var toks struct {
		Tokens []api.Token `json:"tokens"`
	}
	if err := c.admin.Do(ctx, "GET", "/v1/tokens", nil, &toks); err != nil || len(toks.Tokens) != 1 {
		t.Fatalf("tokens: %v %+v", err, toks)
	}
	wantRefused("revoking the last admin's last token", c.admin.Do(ctx, "DELETE", "/v1/tokens/"+toks.Tokens[0].ID, nil, nil))
	var me api.WhoAmI
	if err := c.admin.Do(ctx, "GET", "/v1/whoami", nil, &me); err != nil || me.Role != api.RoleAdmin {
		t.Fatalf("after the refusals: %v %+v, want still admin", err, me)
	}

	// With a second admin, the first may step down and be removed; then
	// the second is the last.
	var tok api.Token
	if err := c.admin.Do(ctx, "POST", "/v1/tokens", api.TokenRequest{User: "root2", Role: api.RoleAdmin}, &tok); err != nil {
		t.Fatal(err)
	}
	root2, _ := api.NewClient(c.url, tok.Secret, c.srv.CAPEM(), nil)
	c.track(root2)
	if err := c.admin.Do(ctx, "POST", "/v1/tokens", api.TokenRequest{User: "admin", Role: api.RoleMember}, nil); err != nil {
		t.Fatalf("demoting admin while root2 is admin: %v", err)
	}
	wantRefused("root2 demoting itself", root2.Do(ctx, "POST", "/v1/tokens", api.TokenRequest{User: "root2", Role: api.RoleMember}, nil))
	wantRefused("removing root2", root2.Do(ctx, "DELETE", "/v1/users/root2", nil, nil))
	if err := root2.Do(ctx, "DELETE", "/v1/users/admin", nil, nil); err != nil {
		t.Fatalf("removing the former admin: %v", err)
	}
	if err := c.admin.Do(ctx, "GET", "/v1/whoami", nil, nil); api.StatusOf(err) != http.StatusUnauthorized {
		t.Errorf("a removed user's token: %v, want 401", err)
	}
	if err := root2.Do(ctx, "DELETE", "/v1/users/nobody", nil, nil); api.StatusOf(err) != http.StatusNotFound {
		t.Errorf("removing a user that does not exist: %v, want 404", err)
	}
}

// TestValuesOutOfRange: durations that overflow, NaN and infinities, and
// values above a maximum are refused with the range in the message, never
// cut or wrapped.
func TestValuesOutOfRange(t *testing.T) {
	c := newCluster(t, server.Config{MaxTimeLimit: time.Hour})
	ctx := context.Background()
	refused := func(what string, err error, want ...string) {
		t.Helper()
		if api.StatusOf(err) != http.StatusBadRequest {
			t.Errorf("%s: %v, want 400", what, err)
			return
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q lacks %q", what, err, w)
			}
		}
	}
	// A TTL whose nanoseconds overflow an int64 used to expire in the past.
	var tok api.Token
	err := c.admin.Do(ctx, "POST", "/v1/tokens", api.TokenRequest{User: "ana", TTLSeconds: 10_000_000_000}, &tok)
	refused("token ttl_s 1e10", err, "315360000")
	if err == nil && tok.Expires != nil && tok.Expires.Before(time.Now()) {
		t.Errorf("the token expired at creation: %s", tok.Expires)
	}
	refused("join token ttl_s two years", c.admin.Do(ctx, "POST", "/v1/join-tokens", api.JoinTokenRequest{TTLSeconds: 2 * 365 * 24 * 3600}, nil), "31536000")
	refused("project period_s 2^62", c.admin.Do(ctx, "PUT", "/v1/projects/p1", map[string]any{"name": "p1", "weight": 1, "period_s": int64(1) << 62}, nil), "period_s")

	// A time limit above the server's maximum is refused, not cut.
	var l api.Lease
	err = c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 1, TimeLimitSeconds: 2 * 3600}, &l)
	refused("time_limit_s above the maximum", err, "1h0m0s", "3600")
	if err == nil {
		t.Logf("lease %s was accepted: %+v", l.ID, l)
	}
	if err := c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 1, TimeLimitSeconds: 3600}, &l); err != nil {
		t.Fatalf("time_limit_s at the maximum: %v", err)
	}
	for _, v := range []string{"NaN", "nan", "Inf", "-Inf", "+Inf", "1e400", "-1", "301"} {
		_, err := c.admin.Raw(ctx, "GET", "/v1/leases/"+l.ID+"?wait_s="+v, nil)
		refused("wait_s="+v, err, "wait_s", "300")
	}
	for _, q := range []string{"after=abc", "limit=1e3", "after=-1"} {
		_, err := c.admin.Raw(ctx, "GET", "/v1/events?"+q, nil)
		refused("events "+q, err)
	}
}

// TestConfigChecked: a server refuses a configuration that contradicts
// itself instead of quietly changing it.
func TestConfigChecked(t *testing.T) {
	for _, cfg := range []server.Config{
		{DefaultTimeLimit: 48 * time.Hour, MaxTimeLimit: 24 * time.Hour},
		{HeartbeatTimeout: -time.Second},
		{PreemptGrace: -time.Second},
	} {
		cfg.DataDir = t.TempDir()
		cfg.Logger = quietLogger()
		srv, err := server.New(context.Background(), cfg)
		if err == nil {
			srv.Close()
			t.Errorf("%+v: accepted", cfg)
		}
	}
}
