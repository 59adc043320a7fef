package cli

import (
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/tally-ledger/tally/migrations"
)

func newDevCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "dev",
		Short: "Run Tally on this machine with everything embedded (for trying it out)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			log := newLogger()
			admin, err := pgx.Connect(ctx, "postgres://root@127.0.0.1:5432/postgres?sslmode=disable")
			if err != nil {
				return fmt.Errorf("local postgres: %w", err)
			}
			var exists bool
			_ = admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = 'tally')").Scan(&exists)
			if !exists {
				if _, err := admin.Exec(ctx, "CREATE DATABASE tally"); err != nil {
					return err
				}
			}
			admin.Close(ctx)
			pool, err := pgxpool.New(ctx, defaultDatabaseURL)
			if err != nil {
				return err
			}
			defer pool.Close()
			v, err := migrations.Up(ctx, pool, log)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "tally dev: database %s migrated to version %d\n", "tally", v)
			return nil
		},
	}
}
