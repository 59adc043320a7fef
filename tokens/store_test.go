package tokens_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/tokens"
	"github.com/tally-ledger/tally/validation"
)

// TestVerify: a live token's secret gives its principal; a revoked, unknown
// or malformed one is ErrUnknown, and each check is reported.
func TestVerify(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.New(t)
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	var checks []tokens.Check
	s, err := tokens.New(tokens.Config{DB: pool, CacheTTL: -1, OnCheck: func(c tokens.Check) { checks = append(checks, c) }})
	if err != nil {
		t.Fatal(err)
	}
	cust, secret, err := tokens.Create(ctx, pool, "acme", "portal", now)
	if err != nil {
		t.Fatal(err)
	}
	gw, gwSecret, err := tokens.CreateGateway(ctx, pool, "gw-eu-1", "", now)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := s.Verify(ctx, secret); err != nil || p != (tokens.Principal{TokenID: cust.ID, Customer: "acme"}) {
		t.Fatalf("Verify(customer token) = %+v, %v", p, err)
	}
	if p, err := s.Verify(ctx, gwSecret); err != nil || p != (tokens.Principal{TokenID: gw.ID, Gateway: "gw-eu-1"}) {
		t.Fatalf("Verify(gateway token) = %+v, %v", p, err)
	}
	if _, err := tokens.Revoke(ctx, pool, cust.ID, now); err != nil {
		t.Fatal(err)
	}
	unknown := tokens.Prefix + secret[len(tokens.Prefix)+1:] + "A"
	for _, bad := range []string{secret, unknown, unknown, tokens.Prefix + "short", "not-a-token"} {
		if _, err := s.Verify(ctx, bad); !errors.Is(err, tokens.ErrUnknown) {
			t.Errorf("Verify(%q) = %v, want ErrUnknown", bad, err)
		}
	}
	want := []tokens.Check{tokens.Queried, tokens.Queried, tokens.Queried, tokens.Queried, tokens.RefusedCached, tokens.Malformed}
	if len(checks) != len(want) {
		t.Fatalf("checks %v, want %v", checks, want)
	}
	for i := range want {
		if checks[i] != want[i] {
			t.Fatalf("checks %v, want %v", checks, want)
		}
	}
}

// TestCreateRefusesBadInput: the field at fault comes back as data.
func TestCreateRefusesBadInput(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.New(t)
	for _, tc := range []struct {
		create func() error
		field  string
	}{
		{func() error { _, _, err := tokens.Create(ctx, pool, "bad id", "", time.Now()); return err }, "customer"},
		{func() error { _, _, err := tokens.CreateGateway(ctx, pool, "", "", time.Now()); return err }, "gateway"},
		{func() error {
			_, _, err := tokens.Create(ctx, pool, "acme", string(make([]byte, 201)), time.Now())
			return err
		}, "description"},
	} {
		fes := validation.Fields(tc.create())
		if len(fes) != 1 || fes[0].Field != tc.field {
			t.Errorf("field errors %v, want one for %s", fes, tc.field)
		}
	}
}

// TestKnownGateway: KnownGateway tells, without a query, a gateway token
// Verify accepted; a customer token, or a token never verified, malformed
// or refused since, is not known.
func TestKnownGateway(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.New(t)
	now := time.Now()
	s, err := tokens.New(tokens.Config{DB: pool, CacheTTL: -1})
	if err != nil {
		t.Fatal(err)
	}
	gw, secret, err := tokens.CreateGateway(ctx, pool, "gw-eu-1", "", now)
	if err != nil {
		t.Fatal(err)
	}
	_, custSecret, err := tokens.Create(ctx, pool, "acme", "", now)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{secret, "not-a-token", tokens.Prefix + "short"} {
		if h, ok := s.KnownGateway(bad); ok {
			t.Errorf("KnownGateway(%q) before any Verify = %q", bad, h)
		}
	}
	for _, tok := range []string{secret, custSecret} {
		if _, err := s.Verify(ctx, tok); err != nil {
			t.Fatal(err)
		}
	}
	if h, ok := s.KnownGateway(secret); !ok || h != "gw-eu-1" {
		t.Fatalf("KnownGateway after Verify = %q, %v", h, ok)
	}
	if h, ok := s.KnownGateway(custSecret); ok {
		t.Fatalf("KnownGateway(a customer token) = %q", h)
	}
	// Revoked, unheard (no listener): refused by the next Verify, and then
	// not known either.
	if _, err := tokens.Revoke(ctx, pool, gw.ID, now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Verify(ctx, secret); !errors.Is(err, tokens.ErrUnknown) {
		t.Fatalf("Verify after revoke: %v", err)
	}
	if h, ok := s.KnownGateway(secret); ok {
		t.Fatalf("KnownGateway after Verify refused it = %q", h)
	}
}
