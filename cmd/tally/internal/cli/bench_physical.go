package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ingest/wire"
	"github.com/tally-ledger/tally/internal/pgcopy"
	"github.com/tally-ledger/tally/internal/pgcpu"
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

var (
	physicalColumns = []string{"operation_id", "producer", "epoch", "customer", "meter", "seq", "total", "quantity",
		"occurred_at", "batch_id"}
	qCopyPhysical = "COPY bench_physical (" + strings.Join(physicalColumns, ", ") + ") FROM STDIN BINARY"
)

// physicalRow is one raw record as a producer sent it.
type physicalRow struct {
	operationID, batchID [16]byte
	producer             string
	epoch                int64
	customer, meter      string
	seq                  int64
	total                decimal.Decimal
	quantity             decimal.NullDecimal
	occurredAt           time.Time
}

// physicalRows decodes msgs (each message once: a retransmit is not a new
// record) into the baseline's rows; decoding is not part of its time,
// encoding them for COPY is (as it is of ingest's). The rows hold a few
// heap objects each, a couple of million for a run: benchIngest builds
// them just before the baseline and drops them after, so that the garbage
// collections of its ingest runs do not mark them, as no ingest process
// outside the benchmark would.
func physicalRows(msgs []benchMessage, records int) ([]physicalRow, error) {
	rows := make([]physicalRow, 0, records)
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
		for _, r := range b.Records {
			rows = append(rows, physicalRow{operationID: r.OperationID, batchID: b.BatchID, producer: b.Producer,
				epoch: b.Epoch, customer: r.Customer, meter: r.Meter, seq: r.Seq, total: r.Total, quantity: r.Quantity,
				occurredAt: r.OccurredAt})
		}
	}
	return rows, nil
}

// physicalCopy encodes rows for COPY into bench_physical as ingest
// encodes its own (internal/pgcopy): pgx's generic CopyFrom would spend
// more of the baseline's time in this process than Postgres spends
// storing the rows, and the baseline would not be the least a store must
// do.
func physicalCopy(buf []byte, rows []physicalRow) ([]byte, error) {
	return pgcopy.Stream(buf[:0], len(rows), len(physicalColumns), func(buf []byte, i int) ([]byte, error) {
		r := &rows[i]
		buf = pgcopy.Bytes(buf, r.operationID[:])
		buf = pgcopy.Text(buf, r.producer)
		buf = pgcopy.Int8(buf, r.epoch)
		buf = pgcopy.Text(buf, r.customer)
		buf = pgcopy.Text(buf, r.meter)
		buf = pgcopy.Int8(buf, r.seq)
		buf, err := pgcopy.Numeric(buf, r.total)
		if err != nil {
			return nil, err
		}
		if r.quantity.Valid {
			if buf, err = pgcopy.Numeric(buf, r.quantity.Decimal); err != nil {
				return nil, err
			}
		} else {
			buf = pgcopy.Null(buf)
		}
		buf = pgcopy.Time(buf, r.occurredAt)
		return pgcopy.Bytes(buf, r.batchID[:]), nil
	})
}

// benchPhysical copies rows into a fresh bench_physical table of the
// database at url, physicalTxRows rows per committed transaction, and
// returns how long that took; with wal, it also prints the WAL it wrote,
// and with cpu (not nil) the CPU it spent.
func benchPhysical(ctx context.Context, out io.Writer, url string, rows []physicalRow, wal bool, cpu cpuPerRecord) (time.Duration, error) {
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
	pg0, pgOK := pgcpu.Backend(pid)
	cpu0 := pgcpu.Process()
	t0 := time.Now()
	var buf []byte
	for from := 0; from < len(rows); from += physicalTxRows {
		chunk := rows[from:min(from+physicalTxRows, len(rows))]
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			var err error
			if buf, err = physicalCopy(buf, chunk); err != nil {
				return err
			}
			return pgcopy.In(ctx, tx.Conn(), "bench_physical", physicalColumns, qCopyPhysical, buf, int64(len(chunk)))
		})
		if err != nil {
			return 0, fmt.Errorf("physical baseline: copy: %w", err)
		}
	}
	took := time.Since(t0)
	if cpu != nil {
		pg1, ok := pgcpu.Backend(pid)
		printCPU(out, "physical baseline", len(rows), pgcpu.Process()-cpu0, pg1-pg0, 1, pgOK && ok, cpu)
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
