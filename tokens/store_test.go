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
