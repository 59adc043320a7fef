package cli

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/tokens"
)

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
		pool, err := pgxpool.New(cmd.Context(), dbURL)
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
			pool, err := open(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			create, owner := tokens.Create, "customer "+customer
			if gateway != "" {
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
		Short: "Revoke a token (by the id shown by list); it stops working at once",
		Args:  cobra.ExactArgs(1),
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
			t, err := tokens.Revoke(cmd.Context(), pool, id, time.Now())
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
			fmt.Fprintf(cmd.OutOrStdout(), "revoked %s (%s) at %s\n", t.ID, owner, t.RevokedAt.UTC().Format(time.RFC3339))
			return nil
		},
	}

	var listCustomer string
	list := &cobra.Command{
		Use:   "list [--customer C]",
		Short: "List tokens (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := open(cmd)
			if err != nil {
				return err
			}
			defer pool.Close()
			ts, err := tokens.List(cmd.Context(), pool, listCustomer)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
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
			return tw.Flush()
		},
	}
	list.Flags().StringVar(&listCustomer, "customer", "", "only this customer's tokens")

	cmd.AddCommand(create, revoke, list)
	return cmd
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
