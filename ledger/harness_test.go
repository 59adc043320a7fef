package ledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/ledger"
)

// fixture is a ledger on its own database with a settable clock.
type fixture struct {
	t    testing.TB
	pool *pgxpool.Pool
	l    *ledger.Ledger
	now  time.Time
	// applyBatch, when set, applies the micro-batches of a unique
	// schedule (applyUniques).
	applyBatch func([]ledger.Record) []ledger.Outcome
}

func newFixture(t testing.TB) *fixture {
	f := &fixture{t: t, pool: pgtest.New(t), now: time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)}
	l, err := ledger.New(ledger.Config{Clock: func() time.Time { return f.now }})
	if err != nil {
		t.Fatal(err)
	}
	f.l = l
	return f
}

// applyUniques applies a micro-batch of a unique schedule: with
// applyBatch when a test set one, else as apply does.
func (f *fixture) applyUniques(recs []ledger.Record) []ledger.Outcome {
	if f.applyBatch != nil {
		return f.applyBatch(recs)
	}
	return f.apply(recs...)
}

// apply applies recs in one transaction and returns the outcomes.
func (f *fixture) apply(recs ...ledger.Record) []ledger.Outcome {
	f.t.Helper()
	var out []ledger.Outcome
	err := pgx.BeginFunc(context.Background(), f.pool, func(tx pgx.Tx) error {
		var err error
		out, err = f.l.Apply(context.Background(), tx, recs)
		return err
	})
	if err != nil {
		f.t.Fatalf("apply: %v", err)
	}
	return out
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(context.Background(), sql, args...); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
}

// awaitLockWait waits until a transaction of the test's database waits
// on a lock.
func (f *fixture) awaitLockWait() {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for f.scalar(`SELECT count(*)::text FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`) == "0" {
		if time.Now().After(deadline) {
			f.t.Fatal("no transaction ever waited on a lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// scalar runs a query returning one text value.
func (f *fixture) scalar(sql string, args ...any) string {
	f.t.Helper()
	var s *string
	if err := f.pool.QueryRow(context.Background(), sql, args...).Scan(&s); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
	if s == nil {
		return "NULL"
	}
	return *s
}

// rec builds a record of stream (p, epoch, customer, meter).
type recBuilder struct {
	producer string
	epoch    int64
	customer string
	meter    string
}

func (b recBuilder) rec(seq int64, total string, occurred time.Time) ledger.Record {
	return ledger.Record{
		OperationID: opID(b, seq),
		Stream:      ledger.StreamKey{Producer: b.producer, Epoch: b.epoch, Customer: b.customer, Meter: b.meter},
		Seq:         seq,
		Total:       amount.MustParse(total),
		OccurredAt:  occurred,
	}
}

func (b recBuilder) recQ(seq int64, total, quantity string, occurred time.Time) ledger.Record {
	r := b.rec(seq, total, occurred)
	r.Quantity = decimal.NewNullDecimal(amount.MustParse(quantity))
	return r
}

// opID is deterministic per stream and seq, like a producer's retransmit.
func opID(b recBuilder, seq int64) uuid.UUID {
	return uuid.NewSHA1(uuid.NameSpaceOID, []byte(fmt.Sprintf("%s/%d/%s/%s/%d", b.producer, b.epoch, b.customer, b.meter, seq)))
}

func kinds(out []ledger.Outcome) string {
	s := ""
	for i, o := range out {
		if i > 0 {
			s += " "
		}
		s += o.Kind.String()
		if o.Reason != "" {
			s += "(" + o.Reason + ")"
		}
	}
	return s
}

// perPeriod is what each period bills, as the rollups hold it:
// "2026-10=6,2026-11=30".
func (f *fixture) perPeriod() string {
	f.t.Helper()
	return f.scalar(`SELECT string_agg(format('%s=%s', to_char(period_start, 'YYYY-MM'), trim_scale(q)), ',' ORDER BY period_start)
		FROM (SELECT period_start, sum(quantity) q FROM rollups GROUP BY 1) s`)
}
