package api

import (
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/ledger"
)

// adjustmentBody is the POST /v1/adjustments body (docs/design.md §7).
type adjustmentBody struct {
	OperationID string  `json:"operation_id"`
	Customer    string  `json:"customer"`
	Meter       string  `json:"meter"`
	Quantity    string  `json:"quantity"`
	OccurredAt  *string `json:"occurred_at"`
	Reason      string  `json:"reason"`
	Actor       string  `json:"actor"`
}

// adjustmentView is the booked adjustment. A retry of the same request
// returns the same view.
type adjustmentView struct {
	ID               uuid.UUID  `json:"id"`
	OperationID      uuid.UUID  `json:"operation_id"`
	Customer         string     `json:"customer"`
	Meter            string     `json:"meter"`
	Quantity         string     `json:"quantity"`
	OccurredAt       time.Time  `json:"occurred_at"`
	Reason           string     `json:"reason"`
	Actor            string     `json:"actor"`
	PeriodStart      time.Time  `json:"period_start"`
	PriorPeriodStart *time.Time `json:"prior_period_start"`
}

// parse turns the body into a ledger.Adjustment, reporting every problem.
func (b adjustmentBody) parse(now time.Time) (ledger.Adjustment, error) {
	var errs []FieldError
	bad := map[string]bool{}
	fail := func(field, format string, args ...any) {
		errs = append(errs, FieldError{Field: field, Detail: fmt.Sprintf(format, args...)})
		bad[field] = true
	}
	adj := ledger.Adjustment{Customer: b.Customer, Meter: b.Meter, Reason: b.Reason, Actor: b.Actor}
	if b.OperationID == "" {
		fail("operation_id", "required: a UUID that stays the same when the request is retried")
	} else if id, err := uuid.Parse(b.OperationID); err != nil || len(b.OperationID) != 36 {
		fail("operation_id", "%s is not a UUID", quote(b.OperationID))
	} else {
		adj.OperationID = id
	}
	if b.Quantity == "" {
		fail("quantity", "required: a signed decimal string such as \"-12.5\"")
	} else if q, err := amount.Parse(b.Quantity); err != nil {
		fail("quantity", "%v", err)
	} else {
		adj.Quantity = q
	}
	if b.OccurredAt != nil {
		t, err := time.Parse(time.RFC3339Nano, *b.OccurredAt)
		switch {
		case err != nil:
			fail("occurred_at", "%s is not an RFC 3339 time such as 2026-11-20T12:00:00Z", quote(*b.OccurredAt))
		case t.After(now.Add(ledger.MaxClockSkew)):
			fail("occurred_at", "%s is in the future", t.UTC().Format(time.RFC3339))
		case t.Year() < 2000:
			fail("occurred_at", "%s is before the year 2000", t.UTC().Format(time.RFC3339))
		default:
			adj.OccurredAt = t
		}
	}
	for _, fe := range fieldsOf(adj.Validate()) {
		if !bad[fe.Field] {
			errs = append(errs, fe)
		}
	}
	if len(errs) > 0 {
		return adj, invalid(errs...)
	}
	return adj, nil
}

func (a *API) postAdjustment(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	if _, err := queryParams(r); err != nil {
		return err
	}
	var body adjustmentBody
	if err := decodeJSON(r, &body); err != nil {
		return err
	}
	adj, err := body.parse(a.now())
	if err != nil {
		return err
	}
	var res ledger.AdjustmentResult
	err = pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		var err error
		res, err = a.ledger.Adjust(ctx, tx, adj)
		return err
	})
	a.forgetUsage(adj.Customer) // after the commit, or after a failure that may have committed
	if err != nil {
		return err
	}
	v := adjustmentView{
		ID: res.ID, OperationID: adj.OperationID, Customer: adj.Customer, Meter: adj.Meter,
		Quantity: adj.Quantity.String(), OccurredAt: res.OccurredAt.UTC(), Reason: adj.Reason, Actor: adj.Actor,
		PeriodStart: res.Period.UTC(),
	}
	if res.PriorPeriod != nil {
		t := res.PriorPeriod.UTC()
		v.PriorPeriodStart = &t
	}
	status := http.StatusOK
	if res.Created {
		status = http.StatusCreated
	}
	writeJSON(w, status, v)
	return nil
}
