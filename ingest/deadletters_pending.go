package ingest

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// qPendingDeadLetters counts by the partial index dead_letters_pending.
const qPendingDeadLetters = `SELECT count(*) FROM dead_letters WHERE replayed_at IS NULL`

// PendingDeadLetters counts the dead letters not replayed yet, without
// reading their bytes.
func PendingDeadLetters(ctx context.Context, db DBTX) (int64, error) {
	rows, err := db.Query(ctx, qPendingDeadLetters)
	if err != nil {
		return 0, fmt.Errorf("ingest: pending dead letters: %w", err)
	}
	n, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, fmt.Errorf("ingest: pending dead letters: %w", err)
	}
	return n, nil
}
