package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ingest/wire"
	"github.com/tally-ledger/tally/ledger"
)

// The physical baseline of tally bench ingest: the least any durable store
// that refuses a duplicate must write for the same usage. The raw records
// (as producers sent them, nothing derived) go by binary COPY into a table
// with one unique index, on the operation id, in transactions of
// physicalTxRows rows, each committed (and so flushed) like a micro-batch.
const (
	physicalTxRows = 10_000

	qCreatePhysical = `
CREATE TABLE bench_physical (
    operation_id uuid        NOT NULL,
    producer     text        NOT NULL,
    epoch        bigint      NOT NULL,
    customer     text        NOT NULL,
    meter        text        NOT NULL,
    seq          bigint      NOT NULL,
    total        numeric     NOT NULL,
    quantity     numeric,
    occurred_at  timestamptz NOT NULL,
    batch_id     uuid        NOT NULL
);
CREATE UNIQUE INDEX bench_physical_operation ON bench_physical (operation_id)`
)

var physicalColumns = []string{"operation_id", "producer", "epoch", "customer", "meter", "seq", "total", "quantity",
	"occurred_at", "batch_id"}

// physicalRows decodes msgs (each message once: a retransmit is not a new
// record) into the baseline's rows; decoding is not part of its time. The
// rows are about a dozen heap objects each (boxed values), millions for a
// run: benchIngest builds them just before the baseline and drops them
// after, so that the garbage collections of its ingest runs do not mark
// them, as no ingest process outside the benchmark would.
func physicalRows(msgs []benchMessage) ([][]any, error) {
	var rows [][]any
	seen := map[string]bool{}
	for _, m := range msgs {
		if seen[string(m.value)] {
			continue
		}
		seen[string(m.value)] = true
		b, _, rejected, err := wire.Decode(m.key, m.value)
		if err != nil || len(rejected) > 0 {
			return nil, fmt.Errorf("physical baseline: a generated message does not decode: %v %v", err, rejected)
		}
		batchID := pgtype.UUID{Bytes: b.BatchID, Valid: true}
		for _, r := range b.Records {
			var q any
			if r.Quantity.Valid {
				q = benchNumeric(r.Quantity.Decimal)
			}
			rows = append(rows, []any{pgtype.UUID{Bytes: r.OperationID, Valid: true}, b.Producer, b.Epoch, r.Customer, r.Meter,
				r.Seq, benchNumeric(r.Total), q, r.OccurredAt, batchID})
		}
	}
	return rows, nil
}

func benchNumeric(d decimal.Decimal) pgtype.Numeric {
	return pgtype.Numeric{Int: d.Coefficient(), Exp: d.Exponent(), Valid: true}
}

// benchPhysical copies rows into a fresh bench_physical table of the
// database at url, physicalTxRows rows per committed transaction, and
// returns how long that took; with wal, it also prints the WAL it wrote,
// and with cpu (not nil) the CPU it spent.
func benchPhysical(ctx context.Context, out io.Writer, url string, rows [][]any, wal bool, cpu cpuPerRecord) (time.Duration, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, qCreatePhysical); err != nil {
		return 0, err
	}
	var w *walWatch
	if wal {
		if w, err = startWAL(ctx, url); err != nil {
			return 0, err
		}
		defer w.stop()
	}
	var pid int32
	if err := conn.QueryRow(ctx, qBackendPID).Scan(&pid); err != nil {
		return 0, err
	}
	if err := settle(ctx, conn); err != nil {
		return 0, err
	}
	pg0, pgOK := backendCPU(pid)
	cpu0 := processCPU()
	t0 := time.Now()
	for from := 0; from < len(rows); from += physicalTxRows {
		chunk := rows[from:min(from+physicalTxRows, len(rows))]
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"bench_physical"}, physicalColumns, pgx.CopyFromRows(chunk))
			return err
		})
		if err != nil {
			return 0, fmt.Errorf("physical baseline: copy: %w", err)
		}
	}
	took := time.Since(t0)
	if cpu != nil {
		pg1, ok := backendCPU(pid)
		printCPU(out, "physical baseline", len(rows), processCPU()-cpu0, pg1-pg0, 1, pgOK && ok, cpu)
	}
	if wal {
		if err := w.report(ctx, out, "physical baseline", len(rows)); err != nil {
			return 0, err
		}
	}
	return took, nil
}

// settle is run just before each measurement, so that none pays for what
// an earlier step left behind. It writes out the server's dirty buffers:
// each measurement starts, like the others, just after a checkpoint (the
// first change of a page after one writes the whole page to the WAL).
// CHECKPOINT needs a superuser or the pg_checkpoint role; without either,
// the measurements run as they are. It also collects this process's
// garbage: the baselines build their rows just before they run, and a
// measurement would otherwise pay for marking them.
func settle(ctx context.Context, q ledger.DBTX) error {
	runtime.GC()
	_, err := q.Exec(ctx, "CHECKPOINT")
	if pe, ok := errors.AsType[*pgconn.PgError](err); ok && pe.Code == "42501" {
		return nil
	}
	return err
}
