package cli

import (
	"strings"
	"testing"

	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/tokens"
)

func TestTokensCreateListRevoke(t *testing.T) {
	db := pgtest.NewURL(t)
	secret, err := runTally(t, "tokens", "create", "--customer", "acme", "--description", "acme portal", "--database-url", db)
	secret = strings.TrimSpace(secret)
	if err != nil || !strings.HasPrefix(secret, tokens.Prefix) || len(secret) < 40 {
		t.Fatalf("create: %q, %v", secret, err)
	}
	list, err := runTally(t, "tokens", "list", "--database-url", db)
	if err != nil || !strings.Contains(list, "acme portal") || strings.Contains(list, secret) {
		t.Fatalf("list: %q, %v", list, err)
	}
	id := strings.Fields(strings.Split(list, "\n")[1])[0]
	out, err := runTally(t, "tokens", "revoke", id, "--database-url", db)
	if err != nil || !strings.Contains(out, "revoked "+id) {
		t.Fatalf("revoke: %q, %v", out, err)
	}
	list, _ = runTally(t, "tokens", "list", "--customer", "acme", "--database-url", db)
	if strings.Contains(list, "\t-\t") || !strings.Contains(list, "Z  acme portal") {
		t.Fatalf("list after revoke: %q", list)
	}
	if _, err := runTally(t, "tokens", "create", "--customer", "bad id", "--database-url", db); err == nil || !strings.Contains(err.Error(), "customer:") {
		t.Fatalf("bad customer id: %v", err)
	}
	if _, err := runTally(t, "tokens", "revoke", "0193e0a1-7c00-7d4e-9a51-3c2f9b7e4a10", "--database-url", db); err == nil || !strings.Contains(err.Error(), "no token") {
		t.Fatalf("revoke unknown: %v", err)
	}
}
