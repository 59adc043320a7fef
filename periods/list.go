package periods

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// qCustomerIDs pages customer ids in order.
const qCustomerIDs = `SELECT id FROM customers WHERE id > @after ORDER BY id LIMIT @limit`

// CustomerIDs lists customer ids in ascending order, after the id after
// ("" from the first), at most limit (default 100).
func CustomerIDs(ctx context.Context, db DBTX, after string, limit int) ([]string, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := db.Query(ctx, qCustomerIDs, pgx.NamedArgs{"after": after, "limit": limit})
	if err != nil {
		return nil, fmt.Errorf("periods: customers: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("periods: customers: %w", err)
	}
	return ids, nil
}
