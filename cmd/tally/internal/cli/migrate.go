package cli

import (
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/tally-ledger/tally/migrations"
)

const defaultDatabaseURL = "postgres://root@127.0.0.1:5432/tally?sslmode=disable"

func newMigrateCmd() *cobra.Command {
	var dbURL string
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply pending database migrations and print the schema version",
		Long: `Apply every pending migration to the database and print the schema version.
Safe to run repeatedly and from several processes at once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := pgxpool.New(ctx, dbURL)
			if err != nil {
				return fmt.Errorf("database: %w", err)
			}
			defer pool.Close()
			v, err := migrations.Up(ctx, pool, newLogger())
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "schema version %d\n", v)
			return nil
		},
	}
	cmd.Flags().StringVar(&dbURL, "database-url", defaultDatabaseURL, "Postgres connection URL")
	envDefault(cmd.Flags(), "database-url", "TALLY_DATABASE_URL")
	return cmd
}
