package scenario

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
)

// DBTX is what Verify needs of a database: a pool, a connection or a
// transaction.
type DBTX interface {
	ledger.DBTX
}

// The ledger reads of Verify, restricted to the run's customers.
const (
	qRollups = `SELECT customer, meter, period_start, sum(quantity)::text
		FROM rollups WHERE customer = ANY($1) GROUP BY 1, 2, 3`
	qStreams = `SELECT producer, epoch, customer, meter, last_seq, last_total::text, final_seq IS NOT NULL
		FROM streams WHERE customer = ANY($1)`
	qGaps = `SELECT s.producer, s.epoch, s.customer, s.meter, g.from_seq, g.to_seq
		FROM gaps g JOIN streams s ON s.id = g.stream_id WHERE s.customer = ANY($1)`
	qDeadLetters = `SELECT convert_from(key, 'UTF8'), count(*)
		FROM dead_letters WHERE key = ANY($1::bytea[]) GROUP BY 1`
	qConflicts = `SELECT customer, meter, count(*) FROM conflicts WHERE customer = ANY($1) GROUP BY 1, 2`
)

// Verify compares the ledger with e and returns one line per difference
// (none when the ledger is exactly what e says). An error means the ledger
// could not be read.
func Verify(ctx context.Context, db DBTX, e *Expect) ([]string, error) {
	var diffs []string
	add := func(format string, a ...any) { diffs = append(diffs, fmt.Sprintf(format, a...)) }

	// Billed usage per customer, meter and period.
	type pk struct {
		customer, meter string
		start           int64
	}
	got := map[pk]decimal.Decimal{}
	var c, m string
	var start time.Time
	var q string
	if _, err := forEach(ctx, db, qRollups, []any{e.Customers}, []any{&c, &m, &start, &q}, func() error {
		d, err := decimal.NewFromString(q)
		got[pk{c, m, start.Unix()}] = d
		return err
	}); err != nil {
		return nil, err
	}
	for _, t := range e.Totals {
		k := pk{t.Customer, t.Meter, t.PeriodStart.Unix()}
		g := got[k]
		delete(got, k)
		if !g.Equal(t.Quantity) {
			add("%s/%s period %s: ledger bills %s, expected %s (%s)", t.Customer, t.Meter, t.Period, g, t.Quantity, signed(g.Sub(t.Quantity)))
		}
	}
	for k, g := range got {
		if !g.IsZero() {
			add("%s/%s period starting %s: ledger bills %s, expected nothing", k.customer, k.meter, time.Unix(k.start, 0).UTC().Format(time.RFC3339), g)
		}
	}

	// Stream states.
	type skey struct {
		producer        string
		epoch           int64
		customer, meter string
	}
	type sstate struct {
		seq   int64
		total decimal.Decimal
		final bool
	}
	streams := map[skey]sstate{}
	var sk skey
	var st sstate
	if _, err := forEach(ctx, db, qStreams, []any{e.Customers}, []any{&sk.producer, &sk.epoch, &sk.customer, &sk.meter, &st.seq, &q, &st.final}, func() error {
		d, err := decimal.NewFromString(q)
		st.total = d
		streams[sk] = st
		return err
	}); err != nil {
		return nil, err
	}
	type gkey struct {
		s        skey
		from, to int64
	}
	wantGaps := map[gkey]bool{}
	for _, s := range e.Streams {
		k := skey{s.Producer, s.Epoch, s.Customer, s.Meter}
		for _, g := range s.Gaps {
			wantGaps[gkey{k, g.From, g.To}] = true
		}
		g, ok := streams[k]
		delete(streams, k)
		name := fmt.Sprintf("stream %s/%d/%s/%s", s.Producer, s.Epoch, s.Customer, s.Meter)
		switch {
		case !ok:
			add("%s: not in the ledger; expected last seq %d, total %s", name, s.LastSeq, s.LastTotal)
			continue
		case g.seq != s.LastSeq || !g.total.Equal(s.LastTotal):
			add("%s: ledger at seq %d total %s, expected seq %d total %s", name, g.seq, g.total, s.LastSeq, s.LastTotal)
		}
		if g.final != s.Final {
			add("%s: final=%v in the ledger, expected %v", name, g.final, s.Final)
		}
	}
	for k, g := range streams {
		add("stream %s/%d/%s/%s: in the ledger (seq %d, total %s) but not expected", k.producer, k.epoch, k.customer, k.meter, g.seq, g.total)
	}

	// Open gaps.
	var gk gkey
	if _, err := forEach(ctx, db, qGaps, []any{e.Customers}, []any{&gk.s.producer, &gk.s.epoch, &gk.s.customer, &gk.s.meter, &gk.from, &gk.to}, func() error {
		if wantGaps[gk] {
			delete(wantGaps, gk)
		} else {
			add("stream %s/%d/%s/%s: open gap seq %d..%d in the ledger, not expected", gk.s.producer, gk.s.epoch, gk.s.customer, gk.s.meter, gk.from, gk.to)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	for g := range wantGaps {
		add("stream %s/%d/%s/%s: expected open gap seq %d..%d, not in the ledger", g.s.producer, g.s.epoch, g.s.customer, g.s.meter, g.from, g.to)
	}

	if err := verifyKinds(ctx, db, e, time.Now(), add); err != nil {
		return nil, err
	}

	// Dead letters and conflicts.
	keys := make([][]byte, 0, len(e.DeadLetters))
	for k := range e.DeadLetters {
		keys = append(keys, []byte(k))
	}
	gotDL := map[string]int{}
	var n int
	if _, err := forEach(ctx, db, qDeadLetters, []any{keys}, []any{&c, &n}, func() error {
		gotDL[c] = n
		return nil
	}); err != nil {
		return nil, err
	}
	for k, want := range e.DeadLetters {
		if gotDL[k] != want {
			add("dead letters keyed %s: %d in the ledger, expected %d", k, gotDL[k], want)
		}
	}
	if _, err := forEach(ctx, db, qConflicts, []any{e.Customers}, []any{&c, &m, &n}, func() error {
		add("%s/%s: %d conflicts in the ledger, expected none", c, m, n)
		return nil
	}); err != nil {
		return nil, err
	}
	sort.Strings(diffs)
	return diffs, nil
}

func forEach(ctx context.Context, db DBTX, sql string, args, scans []any, fn func() error) (int, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return 0, fmt.Errorf("verify: %w", err)
	}
	n := 0
	_, err = pgx.ForEachRow(rows, scans, func() error { n++; return fn() })
	if err != nil {
		return n, fmt.Errorf("verify: %w", err)
	}
	return n, nil
}

func signed(d decimal.Decimal) string {
	if d.Sign() > 0 {
		return "over by " + d.String()
	}
	return "short by " + d.Neg().String()
}

// verifyKinds compares the gauges' max, latest and unit_seconds and the
// unique meters' distinct members with the ledger's answer through now,
// read as the usage answer reads them (ledger.ReadKinds), for every
// customer of the run in every period from the truth's first to its last.
func verifyKinds(ctx context.Context, db DBTX, e *Expect, now time.Time, add func(string, ...any)) error {
	type pk struct {
		customer, meter string
		start           int64
	}
	wantG, wantU := map[pk]GaugeTotal{}, map[pk]UniqueTotal{}
	starts := map[int64]bool{}
	for _, g := range e.Gauges {
		wantG[pk{g.Customer, g.Meter, g.PeriodStart.Unix()}] = g
		starts[g.PeriodStart.Unix()] = true
	}
	for _, u := range e.Uniques {
		wantU[pk{u.Customer, u.Meter, u.PeriodStart.Unix()}] = u
		starts[u.PeriodStart.Unix()] = true
	}
	if len(starts) == 0 {
		return nil
	}
	first, last := int64(math.MaxInt64), int64(math.MinInt64)
	for start := range starts {
		first, last = min(first, start), max(last, start)
	}
	cal := periods.DefaultCalendar()
	names := map[int64]string{}
	gotG, gotU := map[pk]ledger.GaugeUsage{}, map[pk]int64{}
	p, err := cal.PeriodAt(time.Unix(first, 0))
	if err != nil {
		return err
	}
	for ; p.Start.Unix() <= last; p, err = cal.PeriodAt(p.End) {
		if err != nil {
			return err
		}
		start := p.Start.Unix()
		names[start] = p.Name
		for _, c := range e.Customers {
			k, err := ledger.ReadKinds(ctx, db, c, "", p, now)
			if err != nil {
				return fmt.Errorf("verify: %w", err)
			}
			for _, g := range k.Gauges(now) {
				gotG[pk{c, g.Meter, start}] = g
			}
			for _, u := range k.Uniques {
				gotU[pk{c, u.Meter, start}] = u.Count
			}
		}
	}
	for k := range gotG {
		if _, ok := wantG[k]; !ok {
			wantG[k] = GaugeTotal{Customer: k.customer, Meter: k.meter, Period: names[k.start]}
		}
	}
	for k, w := range wantG {
		g := gotG[k]
		for _, f := range []struct {
			name      string
			got, want decimal.Decimal
		}{{"max", g.Max, w.Max}, {"latest", g.Latest, w.Latest}, {"unit_seconds", g.UnitSeconds, w.UnitSeconds}} {
			if !f.got.Equal(f.want) {
				add("%s/%s period %s: ledger's %s %s, expected %s (%s)", w.Customer, w.Meter, w.Period, f.name, f.got, f.want, signed(f.got.Sub(f.want)))
			}
		}
	}
	for k := range gotU {
		if _, ok := wantU[k]; !ok {
			wantU[k] = UniqueTotal{Customer: k.customer, Meter: k.meter, Period: names[k.start]}
		}
	}
	for k, w := range wantU {
		if n := gotU[k]; n != w.Members {
			add("%s/%s period %s: ledger counts %d distinct members, expected %d (%s)", w.Customer, w.Meter, w.Period, n, w.Members, signed(decimal.NewFromInt(n-w.Members)))
		}
	}
	return nil
}
