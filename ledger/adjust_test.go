package ledger_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/ledger"
)

func (f *fixture) adjust(adj ledger.Adjustment) (ledger.AdjustmentResult, error) {
	var res ledger.AdjustmentResult
	err := pgx.BeginFunc(context.Background(), f.pool, func(tx pgx.Tx) error {
		var err error
		res, err = f.l.Adjust(context.Background(), tx, adj)
		return err
	})
	return res, err
}

func TestAdjustIsIdempotent(t *testing.T) {
	f := newFixture(t)
	credit := ledger.Adjustment{
		OperationID: uuid.Must(uuid.NewV7()), Customer: "acme", Meter: "api_calls",
		Quantity: amount.MustParse("-2.5"), Reason: "outage credit INC-42", Actor: "ops@example.com",
	}
	first, err := f.adjust(credit)
	if err != nil || !first.Created {
		t.Fatalf("first: %+v, %v", first, err)
	}
	if got := first.Period.Format("2006-01-02"); got != "2026-11-01" {
		t.Fatalf("period = %s", got)
	}
	f.now = f.now.Add(time.Hour) // a retry later, without occurred_at, is still the same request
	again, err := f.adjust(credit)
	if err != nil || again.Created || again.ID != first.ID {
		t.Fatalf("retry: %+v, %v (first %v)", again, err, first.ID)
	}
	other := credit
	other.Quantity = amount.MustParse("-3")
	if _, err := f.adjust(other); !errors.Is(err, ledger.ErrAdjustmentConflict) {
		t.Fatalf("other body, same id: %v", err)
	}
	if got := f.scalar(`SELECT trim_scale(sum(quantity))::text FROM rollups WHERE customer = 'acme'`); got != "-2.5" {
		t.Fatalf("rollup = %s", got)
	}
	if got := f.scalar(`SELECT format('%s|%s', reason, actor) FROM entries`); got != "outage credit INC-42|ops@example.com" {
		t.Fatalf("entry = %s", got)
	}
}

func TestAdjustValidation(t *testing.T) {
	err := ledger.Adjustment{Customer: "ácme", Meter: ""}.Validate()
	for _, want := range []string{
		"operation_id: required",
		`customer: "ácme" is not 1-128 characters`,
		`meter: "" is not 1-128 characters`,
		"quantity: must not be zero",
		"reason: required",
		"actor: required",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
}
