package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// walWatch follows the server's WAL while a measurement runs and adds up,
// per table and index of one database, what was written: a figure the
// machine's load does not change. It reads the WAL back with pg_walinspect
// (a superuser's), a fraction of a second behind its writer. Other
// databases of the server force checkpoints that recycle WAL segments soon
// after they are written, so the watch holds a temporary replication slot
// of its own (dropped with its session) that keeps the WAL it has not read
// yet, and moves it on as it reads. Records of other databases are left
// out.
type walWatch struct {
	conn *pgx.Conn
	db   string
	slot string

	mu   sync.Mutex
	pos  string
	sums map[string]*walSum
	xids map[string]bool // transactions that wrote to this database
	err  error

	quit chan struct{}
	done chan struct{}
}

type walSum struct{ records, bytes, fpi int64 }

const (
	qCreateWALInspect = `CREATE EXTENSION IF NOT EXISTS pg_walinspect`
	// The WAL records from $1 to $2, none when no whole record past $1 is
	// flushed yet. pg_walinspect raises an error then, and an error that
	// reaches the session drops its temporary slot: the function catches it.
	qWALRecordsFunc = `
CREATE FUNCTION pg_temp.tally_wal_records(from_lsn pg_lsn, to_lsn pg_lsn)
RETURNS TABLE (xid xid, resource_manager text, record_length int4, fpi_length int4, end_lsn pg_lsn, block_ref text)
LANGUAGE plpgsql AS $$
BEGIN
  RETURN QUERY SELECT r.xid, r.resource_manager, r.record_length, r.fpi_length, r.end_lsn, r.block_ref
    FROM pg_get_wal_records_info(from_lsn, to_lsn) r;
EXCEPTION WHEN internal_error THEN
  IF SQLERRM NOT LIKE 'could not find a valid record%' THEN
    RAISE;
  END IF;
END $$`
	qWALStart = `SELECT pg_current_wal_insert_lsn()::text, (SELECT oid FROM pg_database WHERE datname = current_database())::text`
	// The flushed position, and whether it is past $1: the start is the
	// insert position, which the flush may not have reached yet.
	qWALFlushed = `SELECT pg_current_wal_flush_lsn()::text, pg_current_wal_flush_lsn() > $1::pg_lsn`
	// A temporary physical slot reserving WAL from now; released as read.
	qWALSlot        = `SELECT pg_create_physical_replication_slot($1, true, true)`
	qWALSlotAdvance = `SELECT pg_replication_slot_advance($1, $2::pg_lsn)`

	// Each WAL record goes to the relation of its first block (the table or
	// index it changed); a record without a block (a commit) goes to its
	// resource manager when its transaction wrote to this database.
	// record_length includes full-page images, also given apart. One more
	// row, with no relation, carries the end of the last whole record
	// read, where the next read starts (NULL when none was).
	qWALByRelation = `
WITH w AS (
  SELECT xid::text AS xid, resource_manager, record_length, fpi_length, end_lsn,
         substring(block_ref FROM ' rel \d+/' || @db::text || '/(\d+)') AS node,
         coalesce(block_ref, '') = '' AS blockless
  FROM pg_temp.tally_wal_records(@from::pg_lsn, @to::pg_lsn)
), x AS (
  SELECT DISTINCT xid FROM w WHERE node IS NOT NULL AND xid <> '0'
  UNION SELECT unnest(@xids::text[])
)
SELECT coalesce(c.relname, CASE WHEN w.node IS NOT NULL THEN 'relfilenode ' || w.node END,
                lower(w.resource_manager) || ' (no block)'),
       count(*), sum(w.record_length), sum(w.fpi_length),
       coalesce(array_agg(DISTINCT w.xid) FILTER (WHERE w.node IS NOT NULL AND w.xid <> '0'), '{}'),
       NULL
FROM w LEFT JOIN pg_class c ON c.relfilenode = w.node::oid
WHERE w.node IS NOT NULL OR (w.blockless AND w.xid IN (SELECT xid FROM x))
GROUP BY 1
UNION ALL SELECT NULL, 0, 0, 0, '{}', (SELECT max(end_lsn) FROM w)::text`
)

// startWAL starts following the WAL from now, for the database at url.
func startWAL(ctx context.Context, url string) (*walWatch, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, qCreateWALInspect); err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("--wal needs the pg_walinspect extension and a superuser: %w", err)
	}
	if _, err := conn.Exec(ctx, qWALRecordsFunc); err != nil {
		conn.Close(ctx)
		return nil, err
	}
	w := &walWatch{conn: conn, sums: map[string]*walSum{}, xids: map[string]bool{},
		slot: "tally_bench_wal_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12],
		quit: make(chan struct{}), done: make(chan struct{})}
	if _, err := conn.Exec(ctx, qWALSlot, w.slot); err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("--wal needs a free replication slot: %w", err)
	}
	if err := conn.QueryRow(ctx, qWALStart).Scan(&w.pos, &w.db); err != nil {
		conn.Close(ctx)
		return nil, err
	}
	go w.follow(context.WithoutCancel(ctx))
	return w, nil
}

func (w *walWatch) follow(ctx context.Context) {
	defer close(w.done)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-w.quit:
			w.poll(ctx)
			return
		case <-t.C:
			if w.poll(ctx) != nil {
				return
			}
		}
	}
}

// poll adds the whole WAL records from the last position to what is
// flushed now. The flushed position may fall inside a record (the WAL is
// written by pages), so the next read starts where the last whole record
// read ended; until a whole record past it is flushed, pg_walinspect finds
// none, and there is nothing to add yet.
func (w *walWatch) poll(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	var to string
	var ahead bool
	if err := w.conn.QueryRow(ctx, qWALFlushed, w.pos).Scan(&to, &ahead); err != nil {
		w.err = err
		return err
	}
	if !ahead {
		return nil
	}
	xids := make([]string, 0, len(w.xids))
	for x := range w.xids {
		xids = append(xids, x)
	}
	rows, err := w.conn.Query(ctx, qWALByRelation, pgx.StrictNamedArgs{"db": w.db, "from": w.pos, "to": to, "xids": xids})
	if err != nil {
		w.err = fmt.Errorf("reading the WAL (it may have been recycled: the server checkpointed faster than it was read): %w", err)
		return w.err
	}
	var rel, last, end *string
	var n, b, fpi int64
	var txs []string
	_, err = pgx.ForEachRow(rows, []any{&rel, &n, &b, &fpi, &txs, &last}, func() error {
		if rel == nil {
			end = last
			return nil
		}
		s := w.sums[*rel]
		if s == nil {
			s = &walSum{}
			w.sums[*rel] = s
		}
		s.records, s.bytes, s.fpi = s.records+n, s.bytes+b, s.fpi+fpi
		for _, x := range txs {
			w.xids[x] = true
		}
		return nil
	})
	if err != nil {
		w.err = err
		return err
	}
	if end == nil {
		return nil // no whole record past w.pos flushed yet
	}
	w.pos = *end
	if _, err := w.conn.Exec(ctx, qWALSlotAdvance, w.slot, w.pos); err != nil {
		w.err = err
		return err
	}
	return nil
}

// stop ends the watch (report does; stop is safe to call again).
func (w *walWatch) stop() {
	select {
	case <-w.quit:
	default:
		close(w.quit)
	}
	<-w.done
	w.conn.Close(context.Background())
}

// report stops the watch and prints the WAL written per record, of the n
// records the measurement wrote, by table and index.
func (w *walWatch) report(ctx context.Context, out io.Writer, label string, n int) error {
	// What the measurement wrote is flushed: its transactions committed.
	select {
	case <-w.quit:
	default:
		close(w.quit)
	}
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return fmt.Errorf("wal of %s: %w", label, w.err)
	}
	type line struct {
		rel string
		walSum
	}
	var lines []line
	var total walSum
	for rel, s := range w.sums {
		lines = append(lines, line{rel, *s})
		total.records, total.bytes, total.fpi = total.records+s.records, total.bytes+s.bytes, total.fpi+s.fpi
	}
	sort.Slice(lines, func(i, j int) bool { return lines[i].bytes > lines[j].bytes })
	per := func(v int64) float64 { return float64(v) / float64(n) }
	fmt.Fprintf(out, "    WAL of %s: %.0f bytes per record, %.0f without full-page images (%d records, %s WAL records)\n",
		label, per(total.bytes), per(total.bytes-total.fpi), n, strconv.FormatInt(total.records, 10))
	for _, l := range lines {
		if per(l.bytes) < 0.05 {
			continue
		}
		fmt.Fprintf(out, "      %-36s %7.1f bytes/record (%6.1f without page images) %6.2f WAL records/record\n",
			l.rel, per(l.bytes), per(l.bytes-l.fpi), per(l.records))
	}
	return nil
}
