package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tally-ledger/tally/internal/pgcopy"
)

// The records of a micro-batch go to Postgres as one binary COPY that the
// ledger encodes itself with internal/pgcopy (not pgx's generic CopyFrom,
// which was the largest single item of ingest's CPU), column for column
// of recordColumns (qCopyRecords), whose types TestCopyColumnTypes pins.

var recordColumns = []string{"stream_id", "seq", "operation_id", "customer", "meter", "total", "quantity", "occurred_at",
	"final", "late_fill", "billed", "period_start", "bucket", "prior_period", "ingested_at"}

// copyRecords writes the new records with one binary COPY: the bulk of
// every micro-batch, and the fastest way into Postgres. (Uniqueness was
// decided under the stream locks, but for the operation ids load did not
// look up; the table's unique keys are the backstop.)
func (a *applier) copyRecords(ctx context.Context, tx Tx) error {
	return a.copyRows(ctx, tx, "records", recordColumns, qCopyRecords, len(a.newRecords), 192, func(buf []byte, i int) ([]byte, error) {
		return appendRecordRow(buf, &a.newRecords[i], a.now)
	})
}

// copyRows writes n new rows into table with one binary COPY of columns
// (statement), through copyNew: row appends the fields of the i-th
// (about rowBytes of them), pgcopy.Stream the stream's header, each
// row's field count and the trailer.
func (a *applier) copyRows(ctx context.Context, tx Tx, table string, columns []string, statement string, n, rowBytes int,
	row func(buf []byte, i int) ([]byte, error)) error {
	if n == 0 {
		return nil
	}
	buf, err := pgcopy.Stream(make([]byte, 0, n*rowBytes+64), n, len(columns), row) // 64: room for the header and trailer
	if err != nil {
		return fmt.Errorf("ledger: write %s: %w", table, err)
	}
	return a.copyNew(ctx, tx, table, columns, statement, buf, n)
}

// appendKeyFields appends the first fields of every table of new usage
// (records and readings): stream_id, seq, operation_id, customer, meter.
func appendKeyFields(buf []byte, streamID int64, r *Record) []byte {
	buf = pgcopy.Int8(buf, streamID)
	buf = pgcopy.Int8(buf, r.Seq)
	buf = pgcopy.Bytes(buf, r.OperationID[:])
	buf = pgcopy.Text(buf, r.Stream.Customer)
	return pgcopy.Text(buf, r.Stream.Meter)
}

// copyNew sends a COPY stream of rows new records or readings into table,
// whose unique key on operation_id is table_operation_id_key. Uniqueness
// was decided under the stream locks, but for the operation ids the load
// did not look up: when the key refuses one of those, the error wraps
// errOperationTaken and Apply tries again, looking every id up.
func (a *applier) copyNew(ctx context.Context, tx Tx, table string, columns []string, statement string, stream []byte, rows int) error {
	if err := pgcopy.In(ctx, tx.Conn(), table, columns, statement, stream, int64(rows)); err != nil {
		var pe *pgconn.PgError
		if !a.lookupAll && errors.As(err, &pe) && pe.Code == uniqueViolation && pe.ConstraintName == table+"_operation_id_key" {
			return fmt.Errorf("%w: %w", errOperationTaken, err)
		}
		return fmt.Errorf("ledger: write %s: %w", table, err)
	}
	return nil
}

// uniqueViolation is Postgres's SQLSTATE for breaking a unique key.
const uniqueViolation = "23505"

// appendRecordRow appends the fields of one row of recordColumns.
func appendRecordRow(buf []byte, nr *newRecord, now time.Time) ([]byte, error) {
	r := nr.rec
	var err error
	buf = appendKeyFields(buf, nr.streamID, r)
	if buf, err = pgcopy.Numeric(buf, r.Total); err != nil {
		return nil, fmt.Errorf("total: %w", err)
	}
	if r.Quantity.Valid {
		if buf, err = pgcopy.Numeric(buf, r.Quantity.Decimal); err != nil {
			return nil, fmt.Errorf("quantity: %w", err)
		}
	} else {
		buf = pgcopy.Null(buf)
	}
	buf = pgcopy.Time(buf, r.OccurredAt)
	buf = pgcopy.Bool(buf, r.Final)
	buf = pgcopy.Bool(buf, nr.lateFill)
	if buf, err = pgcopy.Numeric(buf, nr.billed); err != nil {
		return nil, fmt.Errorf("billed: %w", err)
	}
	buf = pgcopy.Time(buf, nr.period)
	buf = pgcopy.Time(buf, nr.bucket)
	if nr.priorPeriod != nil {
		buf = pgcopy.Time(buf, *nr.priorPeriod)
	} else {
		buf = pgcopy.Null(buf)
	}
	return pgcopy.Time(buf, now), nil
}
