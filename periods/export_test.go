package periods

import "context"

// ResolveWall exposes resolveWall to the external tests.
var ResolveWall = resolveWall

// StatementFromRecords is the statement computed as a close computes it
// (from the period's records and entries), for the benchmark's baseline.
func (s Store) StatementFromRecords(ctx context.Context, db DBTX, customer string, p Period) (Statement, error) {
	st, _, err := s.compute(ctx, db, customer, p)
	return st, err
}
