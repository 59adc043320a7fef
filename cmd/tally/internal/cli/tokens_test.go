package cli

import (
	"bytes"
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

// TestTokensCreateForANewCustomer: a token for a customer the ledger does
// not know yet is legitimate (usage may come later) and creating it
// registers the customer, so the token reads zero usage at once; a note on
// stderr says so, which shows a mistyped id. A known customer gets no note.
func TestTokensCreateForANewCustomer(t *testing.T) {
	db := pgtest.NewURL(t)
	create := func() (string, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		if code := execute(t.Context(), []string{"tokens", "create", "--customer", "review-nosuch-cust", "--database-url", db}, &out, &errOut); code != 0 {
			t.Fatalf("create: exit %d\n%s", code, errOut.String())
		}
		return out.String(), errOut.String()
	}
	secret, stderr := create()
	if !strings.HasPrefix(secret, tokens.Prefix) {
		t.Fatalf("create printed %q", secret)
	}
	note := `note: customer "review-nosuch-cust" was unknown to the ledger; it is registered now, with the default calendar (monthly, UTC)`
	if !strings.Contains(stderr, note) || strings.Count(stderr, "\n") != 2 {
		t.Errorf("stderr of a token for a new customer: want the token line and a one-line note %q; got\n%s", note, stderr)
	}
	// It is a customer now: other commands know it, and a second token
	// gets no note.
	if _, err := runTally(t, "periods", "list", "--customer", "review-nosuch-cust", "--database-url", db); err != nil {
		t.Errorf("periods list after the token: %v", err)
	}
	if _, stderr := create(); strings.Contains(stderr, "note:") {
		t.Errorf("a token for a known customer has a note:\n%s", stderr)
	}
}

// A description is any text of up to 200 characters (an admin may store
// one over REST): the list prints its control characters escaped, so a
// newline cannot forge a row and an escape sequence cannot act on the
// terminal of whoever runs it.
func TestTokensListEscapesControlCharacters(t *testing.T) {
	db := pgtest.NewURL(t)
	if _, err := runTally(t, "tokens", "create", "--customer", "acme", "--description", "a\x1b[2J\nforged-row\u202e", "--database-url", db); err != nil {
		t.Fatal(err)
	}
	list, err := runTally(t, "tokens", "list", "--database-url", db)
	if err != nil || strings.ContainsAny(list, "\x1b\u202e") || strings.Count(list, "\n") != 2 || !strings.Contains(list, `a\x1b[2J\nforged-row\u202e`) {
		t.Fatalf("list: %q, %v", list, err)
	}
}
