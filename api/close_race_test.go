package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/reconcile"
)

// rawDo is f.do for goroutines: no validation, no t.Fatal.
func (f *fixture) rawDo(method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		j, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, f.srv.URL+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := f.srv.Client().Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, b, err
}

// TestCloseRacesEveryKindOfLateUsage: counter usage, gauge readings,
// unique members and manual adjustments of October arrive from many
// goroutines while October is closed through REST and through
// periods.Store.Close at once, and statements are read throughout. Every
// close answers one frozen statement; every statement read is that one or
// a live one; the frozen counter line equals the ledger rows booked in
// October; what October's statement leaves out is billed, once, as
// prior-period adjustments; and a reconciliation afterwards is clean.
func TestCloseRacesEveryKindOfLateUsage(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // now: 2026-11-20T12:00Z, October awaiting its close
	ctx := context.Background()
	for m, k := range map[string]string{"seats": "gauge", "mau": "unique"} {
		if r := f.do("PUT", "/v1/meters/"+m, adminToken, map[string]any{"kind": k}); r.status != 200 {
			t.Fatalf("declare %s: %d %s", m, r.status, r.body)
		}
	}
	oct := func(i int) time.Time { return time.Date(2026, 10, 1+i%30, 1+i%20, 0, 0, 0, time.UTC) }
	f.usage("acme", "calls", oct(0), "1")

	const writers, each = 4, 12
	big := amount.MustParse("123456789012345678901234567.123456789")
	var mu sync.Mutex
	var errs []error
	fail := func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() }
	var closes, reads [][]byte
	var wg sync.WaitGroup
	start := make(chan struct{})
	apply := func(rec ledger.Record) {
		err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			out, err := f.ledger.Apply(ctx, tx, []ledger.Record{rec})
			if err == nil && out[0].Kind != ledger.Applied {
				err = fmt.Errorf("outcome %v: %s", out[0].Kind, out[0].Detail)
			}
			return err
		})
		if err != nil {
			fail(fmt.Errorf("apply %s seq %d: %w", rec.Stream.Meter, rec.Seq, err))
		}
	}
	for w := 0; w < writers; w++ {
		wg.Add(4)
		producer := fmt.Sprintf("p%d", w)
		go func() { // counter
			defer wg.Done()
			<-start
			total := decimal.Zero
			for i := 1; i <= each; i++ {
				total = total.Add(big)
				apply(ledger.Record{OperationID: uuid.Must(uuid.NewV7()), Stream: ledger.StreamKey{Producer: producer, Epoch: 1, Customer: "acme", Meter: "calls"},
					Seq: int64(i), Total: total, OccurredAt: oct(w*each + i)})
			}
		}()
		go func() { // gauge
			defer wg.Done()
			<-start
			for i := 1; i <= each; i++ {
				apply(ledger.Record{OperationID: uuid.Must(uuid.NewV7()), Stream: ledger.StreamKey{Producer: producer, Epoch: 1, Customer: "acme", Meter: "seats"},
					Seq: int64(i), OccurredAt: time.Date(2026, 10, 2, 0, 0, i, 0, time.UTC), Shape: ledger.Gauge, Level: decimal.NewFromInt(int64(i * (w + 1)))})
			}
		}()
		go func() { // unique
			defer wg.Done()
			<-start
			for i := 1; i <= each; i++ {
				apply(ledger.Record{OperationID: uuid.Must(uuid.NewV7()), Stream: ledger.StreamKey{Producer: producer, Epoch: 1, Customer: "acme", Meter: "mau"},
					Seq: int64(i), OccurredAt: oct(i), Shape: ledger.Unique, Member: fmt.Sprintf("u%d-%d", w, i)})
			}
		}()
		go func() { // adjustments through REST, each sent twice
			defer wg.Done()
			<-start
			for i := 1; i <= each/2; i++ {
				body := map[string]any{"operation_id": uuid.NewString(), "customer": "acme", "meter": "calls", "quantity": "-0.000000001",
					"occurred_at": oct(i).Format(time.RFC3339), "reason": "credit", "actor": "ops"}
				for range 2 {
					if st, b, err := f.rawDo("POST", "/v1/adjustments", body); err != nil || st != 201 && st != 200 {
						fail(fmt.Errorf("adjustment: %d %s %v", st, b, err))
					}
				}
			}
		}()
	}
	store := periods.Store{Clock: f.clock, Gate: reconcile.Gate, Kinds: ledger.StatementKinds}
	for c := 0; c < 4; c++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			if c%2 == 0 {
				st, b, err := f.rawDo("POST", "/v1/customers/acme/periods/2026-10-01/close", map[string]any{"force": true, "reason": "race", "actor": "ops"})
				if err != nil || st != 200 {
					fail(fmt.Errorf("close: %d %s %v", st, b, err))
					return
				}
				mu.Lock()
				closes = append(closes, b)
				mu.Unlock()
				return
			}
			err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
				_, err := store.Close(ctx, tx, periods.CloseRequest{Customer: "acme", Period: "2026-10-01", Force: true, Reason: "race", Actor: "ops"})
				return err
			})
			if err != nil {
				fail(fmt.Errorf("store close: %w", err))
			}
		}()
		go func() {
			defer wg.Done()
			<-start
			for i := 0; i < 10; i++ {
				st, b, err := f.rawDo("GET", "/v1/customers/acme/periods/2026-10-01/statement", nil)
				if err != nil || st != 200 {
					fail(fmt.Errorf("statement: %d %s %v", st, b, err))
					return
				}
				mu.Lock()
				reads = append(reads, b)
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	frozen := f.do("GET", "/v1/customers/acme/periods/2026-10-01/statement", adminToken, nil)
	for _, b := range closes {
		if !bytes.Equal(b, frozen.body) {
			t.Fatalf("a close answered\n%s\nthe stored statement is\n%s", b, frozen.body)
		}
	}
	for _, b := range reads {
		var st struct {
			Final bool `json:"final"`
		}
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatal(err)
		}
		if st.Final && !bytes.Equal(b, frozen.body) {
			t.Fatalf("a final statement read\n%s\nthe stored statement is\n%s", b, frozen.body)
		}
	}
	var st periods.Statement
	if err := json.Unmarshal(frozen.body, &st); err != nil {
		t.Fatal(err)
	}
	octStart := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
	var inOct, later, sent decimal.Decimal
	q := func(dst *decimal.Decimal, sql string, args ...any) {
		t.Helper()
		var s string
		if err := f.pool.QueryRow(ctx, sql, args...).Scan(&s); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		*dst = amount.MustParse(s)
	}
	q(&inOct, `SELECT trim_scale(coalesce((SELECT sum(billed) FROM records WHERE customer = 'acme' AND meter = 'calls' AND period_start = $1), 0)
		+ coalesce((SELECT sum(amount) FROM entries WHERE customer = 'acme' AND meter = 'calls' AND period_start = $1), 0))::text`, octStart)
	q(&later, `SELECT trim_scale(coalesce((SELECT sum(billed) FROM records WHERE customer = 'acme' AND meter = 'calls' AND prior_period = $1), 0)
		+ coalesce((SELECT sum(amount) FROM entries WHERE customer = 'acme' AND meter = 'calls' AND prior_period = $1), 0))::text`, octStart)
	sent = decimal.NewFromInt(1).Add(big.Mul(decimal.NewFromInt(writers * each))).Sub(amount.MustParse("0.000000001").Mul(decimal.NewFromInt(writers * each / 2)))
	var line periods.Line
	for _, l := range st.Lines {
		if l.Meter == "calls" {
			line = l
		}
	}
	if !line.Billed.Equal(inOct) {
		t.Errorf("October's frozen statement bills %s; its ledger rows add up to %s", line.Billed, inOct)
	}
	if !inOct.Add(later).Equal(sent) {
		t.Errorf("October billed %s + %s later = %s; %s was sent", inOct, later, inOct.Add(later), sent)
	}
	t.Logf("october billed %s, later %s; statement %s", inOct, later, frozen.body)

	// A reconciliation of both periods finds nothing wrong.
	for _, p := range []string{"2026-10-01", "2026-11-01"} {
		r := f.do("POST", "/v1/reconciliations", adminToken, map[string]any{"period": p, "customer": "acme"})
		if r.status != 201 {
			t.Fatalf("reconcile %s: %d %s", p, r.status, r.body)
		}
		var run reconcile.Run
		if err := json.Unmarshal(r.body, &run); err != nil {
			t.Fatal(err)
		}
		if run.Discrepancies() > 0 {
			t.Errorf("reconcile %s: %s: %+v", p, run.Status, run.Findings)
		}
	}
}
