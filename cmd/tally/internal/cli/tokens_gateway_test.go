package cli

import (
	"strings"
	"testing"

	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/tokens"
)

func TestTokensCreateGateway(t *testing.T) {
	db := pgtest.NewURL(t)
	secret, err := runTally(t, "tokens", "create", "--gateway", "gw-eu-1", "--database-url", db)
	if secret = strings.TrimSpace(secret); err != nil || !strings.HasPrefix(secret, tokens.Prefix) {
		t.Fatalf("create: %q, %v", secret, err)
	}
	list, err := runTally(t, "tokens", "list", "--database-url", db)
	if err != nil || !strings.Contains(list, "gateway:gw-eu-1") {
		t.Fatalf("list: %q, %v", list, err)
	}
	if _, err := runTally(t, "tokens", "create", "--gateway", "gw", "--customer", "acme", "--database-url", db); err == nil {
		t.Fatal("a token for a customer and a gateway at once")
	}
	if _, err := runTally(t, "tokens", "create", "--gateway", "bad id", "--database-url", db); err == nil || !strings.Contains(err.Error(), "gateway:") {
		t.Fatalf("bad gateway id: %v", err)
	}
}
