package cli

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// stmtTrace adds up, per statement (a pipelined batch counts as one, named
// by its statements), how often ingest's connections ran it and how long
// each took from send to answer: where a micro-batch's time goes, round
// trip by round trip. Times are wall-clock, so the machine's load is in
// them; their shares of one run are what compares.
type stmtTrace struct {
	mu   sync.Mutex
	sums map[string]*stmtSum
}

type stmtSum struct {
	n       int64
	elapsed time.Duration
}

type traceStart struct{}

func newStmtTrace() *stmtTrace { return &stmtTrace{sums: map[string]*stmtSum{}} }

var sqlWords = regexp.MustCompile(`\s+`)

// stmtName is a statement's first words: enough to tell the ledger's and
// ingest's statements apart.
func stmtName(sql string) string {
	s := strings.TrimSpace(sqlWords.ReplaceAllString(sql, " "))
	if len(s) > 48 {
		s = s[:48]
	}
	return s
}

func (t *stmtTrace) add(name string, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.sums[name]
	if s == nil {
		s = &stmtSum{}
		t.sums[name] = s
	}
	s.n++
	s.elapsed += d
}

func (t *stmtTrace) start(ctx context.Context) context.Context {
	return context.WithValue(ctx, traceStart{}, time.Now())
}

func (t *stmtTrace) end(ctx context.Context, name string) {
	if t0, ok := ctx.Value(traceStart{}).(time.Time); ok {
		t.add(name, time.Since(t0))
	}
}

func (t *stmtTrace) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(t.start(ctx), traceName{}, stmtName(d.SQL))
}

type traceName struct{}

func (t *stmtTrace) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	name, _ := ctx.Value(traceName{}).(string)
	t.end(ctx, name)
}

func (t *stmtTrace) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	var names []string
	for _, q := range d.Batch.QueuedQueries {
		names = append(names, stmtName(q.SQL))
	}
	return context.WithValue(t.start(ctx), traceName{}, "batch["+strings.Join(names, " | ")+"]")
}

func (t *stmtTrace) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (t *stmtTrace) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	name, _ := ctx.Value(traceName{}).(string)
	t.end(ctx, name)
}

func (t *stmtTrace) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceCopyFromStartData) context.Context {
	return context.WithValue(t.start(ctx), traceName{}, "COPY "+d.TableName.Sanitize())
}

func (t *stmtTrace) TraceCopyFromEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceCopyFromEndData) {
	name, _ := ctx.Value(traceName{}).(string)
	t.end(ctx, name)
}

// report prints the statements by total time, per call and per record of
// the n records of the run that took took.
func (t *stmtTrace) report(out io.Writer, label string, n int, took time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	type line struct {
		name string
		stmtSum
	}
	var lines []line
	var total time.Duration
	for name, s := range t.sums {
		lines = append(lines, line{name, *s})
		total += s.elapsed
	}
	sort.Slice(lines, func(i, j int) bool { return lines[i].elapsed > lines[j].elapsed })
	fmt.Fprintf(out, "    statements of %s: %.1f µs of round trips per record (all connections; the run took %.1f µs per record)\n",
		label, float64(total.Microseconds())/float64(n), float64(took.Microseconds())/float64(n))
	for _, l := range lines {
		if l.elapsed < total/200 {
			continue
		}
		fmt.Fprintf(out, "      %5.1f%% %7d × %8.0f µs  %s\n", 100*float64(l.elapsed)/float64(total), l.n,
			float64(l.elapsed.Microseconds())/float64(l.n), l.name)
	}
}
