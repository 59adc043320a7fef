package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/tokens"
	"github.com/tally-ledger/tally/validation"
)

// tokensPage is how many tokens tally tokens list reads at a time.
var tokensPage = 1000

// tokensTracer, when not nil, traces the statements of tally tokens (tests
// read what the list command asks of the database).
var tokensTracer pgx.QueryTracer

func newTokensCmd() *cobra.Command {
	var dbURL string
	cmd := &cobra.Command{
		Use:   "tokens",
		Short: "Create, list and revoke customer and gateway tokens (needs direct database access)",
		Long: `Create, list and revoke customer and gateway tokens for the REST API.
This needs direct database access (--database-url, TALLY_DATABASE_URL).

  - a customer token (--customer C) lets a customer, or its portal, read
    its own usage, calendar and quotas, and nothing else;
  - a gateway token (--gateway H) lets a gateway using the admit SDK
    issue, renew and release holder H's grants and report its bypasses.

Only a hash of each token is stored: the token is printed once, by
create, and cannot be shown again. Without database access, an admin does
the same over REST with the admin token: POST /v1/tokens, GET /v1/tokens
and POST /v1/tokens/{id}/revoke (docs/api.md). The admin token is not
managed here; it is TALLY_ADMIN_TOKEN.`,
	}
	cmd.PersistentFlags().StringVar(&dbURL, "database-url", defaultDatabaseURL, "Postgres connection URL")
	envDefault(cmd.PersistentFlags(), "database-url", "TALLY_DATABASE_URL")
	open := func(cmd *cobra.Command) (*pgxpool.Pool, error) {
		cfg, err := pgxpool.ParseConfig(dbURL)
		if err != nil {
			return nil, fmt.Errorf("database: %w", err)
		}
		if tokensTracer != nil {
			cfg.ConnConfig.Tracer = tokensTracer
		}
		pool, err := pgxpool.NewWithConfig(cmd.Context(), cfg)
		if err != nil {
			return nil, fmt.Errorf("database: %w", err)
		}
		return pool, nil
	}

	var customer, gateway, description string
	create := &cobra.Command{
		Use:   "create (--customer C | --gateway H) [--description D]",
		Short: "Create a read-only token for one customer, or a gateway token, and print it (once)",
		Long: `A customer token reads its own customer. A gateway token (--gateway H)
may issue, renew and release only holder H's grants and report its bypasses.
A token for a customer the ledger does not know yet registers it, with the
default calendar (monthly, UTC): the token reads zero usage until usage
arrives, and a note on stderr says the customer is new.`,
		Example: `  tally tokens create --customer acme --description "acme portal"
  tally tokens create --gateway gw-eu-1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The flag given says which token: an empty --gateway is a
			// gateway token without its holder, not a customer token.
			isGateway := cmd.Flags().Changed("gateway")
			if err := checkTokenFlags(isGateway, customer, gateway, description); err != nil {
				return usageError(err)
			}
			pool, err := open(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			create, owner := tokens.Create, "customer "+customer
			if isGateway {
				create, owner = tokens.CreateGateway, "gateway "+gateway
			}
			// A token may come before its customer's usage: creating it
			// registers the customer (tokens.Create). Say so when the
			// customer is new, which shows a mistyped id.
			newCustomer := false
			if customer != "" {
				_, err := periods.Store{}.Customer(cmd.Context(), pool, customer)
				if newCustomer = errors.Is(err, periods.ErrUnknownCustomer); err != nil && !newCustomer {
					return err
				}
			}
			t, secret, err := create(cmd.Context(), pool, customer+gateway, description, time.Now())
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintln(w, secret)
			fmt.Fprintf(cmd.ErrOrStderr(), "token %s for %s: store it now, it is not shown again\n", t.ID, owner)
			if newCustomer {
				fmt.Fprintf(cmd.ErrOrStderr(), "note: customer %q was unknown to the ledger; it is registered now, with the default calendar (monthly, UTC), "+
					"and the token reads its usage, zero until some arrives (a mistyped id? tally tokens revoke %s)\n", customer, t.ID)
			}
			return nil
		},
	}
	create.Flags().StringVar(&customer, "customer", "", "customer id the token may read")
	create.Flags().StringVar(&gateway, "gateway", "", "holder id of the gateway whose grants the token manages")
	create.Flags().StringVar(&description, "description", "", "what the token is for (shown by list)")
	create.MarkFlagsOneRequired("customer", "gateway")
	create.MarkFlagsMutuallyExclusive("customer", "gateway")

	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a token (by the id shown by list): each API process refuses it as soon as it hears, within 5 s by default",
		Long: `Revoke a token (by the id shown by list): each API process refuses it as
soon as it hears, within 5 s by default. Revoking a token already revoked
changes nothing and succeeds too: it prints "already revoked" and when.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := uuid.Parse(args[0])
			if err != nil {
				return usageError(fmt.Errorf("%q is not a token id (see tally tokens list)", args[0]))
			}
			pool, err := open(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			now := time.Now()
			t, err := tokens.Revoke(cmd.Context(), pool, id, now)
			if errors.Is(err, tokens.ErrNotFound) {
				return fmt.Errorf("no token %s (see tally tokens list)", id)
			}
			if err != nil {
				return err
			}
			owner := "customer " + t.Customer
			if t.Gateway != "" {
				owner = "gateway " + t.Gateway
			}
			at := t.RevokedAt.UTC().Format(time.RFC3339)
			// Revoking again keeps the first time (tokens.Revoke): a time
			// other than now says the token was revoked before.
			if !t.RevokedAt.Equal(now.Truncate(time.Microsecond)) {
				fmt.Fprintf(cmd.OutOrStdout(), "already revoked %s (%s) at %s; nothing changed\n", t.ID, owner, at)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked %s (%s) at %s\n", t.ID, owner, at)
			return nil
		},
	}

	var listCustomer string
	list := &cobra.Command{
		Use:   "list [--customer C]",
		Short: "List tokens (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkCustomerFlag(cmd, listCustomer); err != nil {
				return usageError(err)
			}
			pool, err := open(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			// Both passes of listTokens read one snapshot: the same tokens.
			return pgx.BeginTxFunc(cmd.Context(), pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
				func(tx pgx.Tx) error { return listTokens(cmd.Context(), tx, listCustomer, cmd.OutOrStdout()) })
		},
	}
	list.Flags().StringVar(&listCustomer, "customer", "", "only this customer's tokens")

	cmd.AddCommand(create, revoke, list)
	return cmd
}

// checkTokenFlags refuses, naming the flag, the id of a token's owner or a
// description the token could not have (tokens.Validate), before the
// database is opened.
func checkTokenFlags(isGateway bool, customer, gateway, description string) error {
	owner := customer
	if isGateway {
		owner = gateway
	}
	var errs []error
	for _, f := range validation.Fields(tokens.Validate(isGateway, owner, description)) {
		errs = append(errs, fmt.Errorf("--%s: %s", f.Field, f.Detail))
	}
	return errors.Join(errs...)
}

// tokenRow is a row of tally tokens list: its cells, column by column.
type tokenRow [5]string

// tokenHeader is the first row of tally tokens list.
var tokenHeader = tokenRow{"ID", "CUSTOMER/GATEWAY", "CREATED (UTC)", "REVOKED (UTC)", "DESCRIPTION"}

// listTokens prints the tokens of customer ("" for all) as a table, oldest
// first, holding a page of tokensPage of them at a time however many
// there are. A column is as wide as its widest cell over all of them
// (plus two spaces), so it reads every page twice: once to measure the
// columns, once to print. db should be a snapshot (a repeatable read
// transaction), so that both passes read the same tokens.
func listTokens(ctx context.Context, db tokens.DBTX, customer string, w io.Writer) error {
	var widths [len(tokenRow{}) - 1]int // the last column is not padded
	measure := func(row tokenRow) error {
		for i := range widths {
			widths[i] = max(widths[i], utf8.RuneCountInString(row[i]))
		}
		return nil
	}
	bw := bufio.NewWriter(w)
	write := func(row tokenRow) error {
		for i, n := range widths {
			fmt.Fprintf(bw, "%-*s", n+2, row[i])
		}
		_, err := fmt.Fprintln(bw, row[len(widths)])
		return err
	}
	for _, pass := range []func(tokenRow) error{measure, write} {
		if err := pass(tokenHeader); err != nil {
			return err
		}
		req := tokens.PageRequest{Customer: customer, Limit: tokensPage}
		for {
			page, err := tokens.Page(ctx, db, req)
			if err != nil {
				return err
			}
			for _, t := range page {
				if err := pass(rowOf(t)); err != nil {
					return err
				}
			}
			if len(page) < req.Limit {
				break
			}
			last := page[len(page)-1]
			req.AfterCreated, req.AfterID = last.CreatedAt, last.ID
		}
	}
	return bw.Flush()
}

// rowOf is the row of t in tally tokens list.
func rowOf(t tokens.Token) tokenRow {
	revoked := "-"
	if t.RevokedAt != nil {
		revoked = t.RevokedAt.UTC().Format(time.RFC3339)
	}
	owner := t.Customer
	if t.Gateway != "" {
		owner = "gateway:" + t.Gateway
	}
	return tokenRow{t.ID.String(), owner, t.CreatedAt.UTC().Format(time.RFC3339), revoked, printable(t.Description)}
}

// printable is s for a terminal: when it holds a character that is not
// printable (a control character, a tab, a bidirectional override), Go's
// escaped form of it, so stored text can neither forge a row of a table
// nor act on the terminal.
func printable(s string) string {
	if strings.IndexFunc(s, func(r rune) bool { return !strconv.IsPrint(r) }) < 0 {
		return s
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}
