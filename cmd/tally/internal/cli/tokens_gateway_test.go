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
	// A bad or empty id is named by its flag: an empty --gateway is no
	// customer token's mistake.
	for _, id := range []string{"bad id", ""} {
		if _, err := runTally(t, "tokens", "create", "--gateway", id, "--database-url", db); err == nil || !strings.HasPrefix(err.Error(), "--gateway:") {
			t.Errorf("gateway id %q: %v, want an error naming gateway", id, err)
		}
	}
	if _, err := runTally(t, "tokens", "create", "--customer", "", "--database-url", db); err == nil || !strings.HasPrefix(err.Error(), "--customer:") {
		t.Errorf("empty customer id: %v, want an error naming customer", err)
	}
}

// tally tokens --help says it makes both kinds of token, that it needs the
// database, and where to go without it.
func TestTokensHelpNamesBothKindsAndTheDatabase(t *testing.T) {
	out, err := runTally(t, "tokens", "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"customer and gateway tokens", "needs direct database access", "--gateway H", "POST /v1/tokens"} {
		if !strings.Contains(out, want) {
			t.Errorf("tokens --help does not say %q:\n%s", want, out)
		}
	}
}

// Revoking a gateway token names the gateway, not an empty customer.
func TestTokensRevokeGatewayNamesIt(t *testing.T) {
	db := pgtest.NewURL(t)
	if _, err := runTally(t, "tokens", "create", "--gateway", "gw-eu-1", "--database-url", db); err != nil {
		t.Fatal(err)
	}
	list, _ := runTally(t, "tokens", "list", "--database-url", db)
	id := strings.Fields(strings.Split(list, "\n")[1])[0]
	out, err := runTally(t, "tokens", "revoke", id, "--database-url", db)
	if err != nil || !strings.Contains(out, "(gateway gw-eu-1)") {
		t.Fatalf("revoke: %q, %v", out, err)
	}
}
