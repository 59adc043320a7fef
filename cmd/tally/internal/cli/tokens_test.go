package cli

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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

// rowsTracer records the most rows one statement returned.
type rowsTracer struct {
	mu  sync.Mutex
	max int64
}

func (r *rowsTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (r *rowsTracer) TraceQueryEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if d.Err == nil && d.CommandTag.Select() {
		r.mu.Lock()
		r.max = max(r.max, d.CommandTag.RowsAffected())
		r.mu.Unlock()
	}
}

// tokensTable is the list as one tabwriter over every token would print
// it: what tally tokens list prints, however many pages it reads.
func tokensTable(ts []tokens.Token) string {
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCUSTOMER/GATEWAY\tCREATED (UTC)\tREVOKED (UTC)\tDESCRIPTION")
	for _, t := range ts {
		revoked := "-"
		if t.RevokedAt != nil {
			revoked = t.RevokedAt.UTC().Format(time.RFC3339)
		}
		owner := t.Customer
		if t.Gateway != "" {
			owner = "gateway:" + t.Gateway
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.ID, owner, t.CreatedAt.UTC().Format(time.RFC3339), revoked, printable(t.Description))
	}
	tw.Flush()
	return b.String()
}

// With more tokens than one page, tally tokens list reads them a page at
// a time (no statement returns more than a page), lists each once, oldest
// first, and aligns its columns over all of them, exactly as when it read
// them at once: the widest customer and the only revoked token are in the
// last page.
func TestTokensListPagesThroughManyTokens(t *testing.T) {
	defer func(p int, tr pgx.QueryTracer) { tokensPage, tokensTracer = p, tr }(tokensPage, tokensTracer)
	tokensPage = 3
	rows := &rowsTracer{}
	tokensTracer = rows

	db := pgtest.NewURL(t)
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// Tokens created at the same instant are ordered by id: pages must
	// neither repeat nor skip them.
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	var last uuid.UUID
	for i, c := range []string{"acme", "beta", "acme", "", "acme", "gamma", "acme", "a-much-longer-customer-name"} {
		var tok tokens.Token
		if c == "" {
			tok, _, err = tokens.CreateGateway(ctx, pool, "gw-eu-1", "eu gateway", at)
		} else {
			desc := fmt.Sprintf("token %d of %s", i, c)
			switch i {
			case 2:
				desc = ""
			case 4:
				desc = "portail d'été, 日本"
			}
			tok, _, err = tokens.Create(ctx, pool, c, desc, at.Add(time.Duration(i/2)*time.Minute))
		}
		if err != nil {
			t.Fatal(err)
		}
		last = tok.ID
	}
	if _, err := tokens.Revoke(ctx, pool, last, at.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}

	for _, customer := range []string{"", "acme"} {
		all, err := tokens.List(ctx, pool, customer)
		if err != nil || len(all) <= tokensPage {
			t.Fatalf("tokens of %q: %d, %v; want more than a page", customer, len(all), err)
		}
		args := []string{"tokens", "list", "--database-url", db}
		if customer != "" {
			args = append(args, "--customer", customer)
		}
		rows.max = 0
		got, err := runTally(t, args...)
		if err != nil {
			t.Fatalf("list %q: %v", customer, err)
		}
		if want := tokensTable(all); got != want {
			t.Errorf("list %q:\n%s\nwant (every token once, oldest first, aligned over all):\n%s", customer, got, want)
		}
		if rows.max > int64(tokensPage) {
			t.Errorf("list %q: one statement returned %d tokens, more than a page (%d)", customer, rows.max, tokensPage)
		}
	}
}

// tokens create refuses an id that is not one as the flag the user gave:
// an empty --gateway was taken for a customer token and refused as
// "customer", after the database was opened, exit 1.
func TestTokensCreateNamesTheFlagAtFault(t *testing.T) {
	db := pgtest.NewURL(t)
	for _, tc := range []struct{ flag, value string }{
		{"--gateway", ""}, {"--gateway", "gw 1"}, {"--customer", ""}, {"--customer", "bad id"},
	} {
		var out, errOut bytes.Buffer
		code := execute(t.Context(), []string{"tokens", "create", tc.flag, tc.value, "--database-url", db}, &out, &errOut)
		if code != exitUsage || !strings.Contains(errOut.String(), tc.flag+": ") || out.Len() != 0 {
			t.Errorf("tokens create %s %q: exit %d, want 2 naming %s; stdout %q, stderr:\n%s", tc.flag, tc.value, code, tc.flag, out.String(), errOut.String())
		}
	}
}

// Revoking a token already revoked changes nothing and succeeds (exit 0),
// and says so, with when it was revoked: it printed the same line as the
// first revocation, as if it had just happened.
func TestTokensRevokeTwiceSaysAlreadyRevoked(t *testing.T) {
	db := pgtest.NewURL(t)
	if _, err := runTally(t, "tokens", "create", "--gateway", "gw-1", "--database-url", db); err != nil {
		t.Fatal(err)
	}
	list, err := runTally(t, "tokens", "list", "--database-url", db)
	if err != nil {
		t.Fatal(err)
	}
	id := strings.Fields(strings.Split(list, "\n")[1])[0]
	first, err := runTally(t, "tokens", "revoke", id, "--database-url", db)
	if err != nil || !strings.HasPrefix(first, "revoked "+id+" (gateway gw-1) at ") {
		t.Fatalf("revoke: %q, %v", first, err)
	}
	at := strings.TrimSpace(strings.TrimPrefix(first, "revoked "+id+" (gateway gw-1) at "))
	time.Sleep(1100 * time.Millisecond) // a second revocation now would print another time
	again, err := runTally(t, "tokens", "revoke", id, "--database-url", db)
	want := "already revoked " + id + " (gateway gw-1) at " + at + "; nothing changed\n"
	if err != nil || again != want {
		t.Fatalf("revoke again: %q, %v; want %q and exit 0", again, err, want)
	}
}
