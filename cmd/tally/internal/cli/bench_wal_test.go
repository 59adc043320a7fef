package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/internal/pgtest"
)

// TestWALWatchFromInsideARecord: the flushed position the watch reads up to
// may fall inside a WAL record (the WAL is flushed by pages), so a read may
// start where no whole record follows yet. The watch waits for one instead
// of failing, and still counts what is written afterwards.
func TestWALWatchFromInsideARecord(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewEmptyURL(t)
	w, err := startWAL(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer w.stop()

	// Put the watch a few bytes before the flushed end: inside the last
	// flushed record, with no whole record after it.
	w.mu.Lock()
	err = w.conn.QueryRow(ctx, `SELECT (pg_current_wal_flush_lsn() - 10)::text`).Scan(&w.pos)
	w.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.poll(ctx); err != nil {
		t.Fatalf("poll from inside a record: %v", err)
	}

	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE walwatch_probe (n int); INSERT INTO walwatch_probe SELECT generate_series(1, 1000)`); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := w.report(ctx, &out, "probe", 1000); err != nil {
		t.Fatalf("report: %v", err)
	}
	if !strings.Contains(out.String(), "walwatch_probe") {
		t.Errorf("the probe table's WAL is not counted:\n%s", out.String())
	}
}
