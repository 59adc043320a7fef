package alerts

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/validation"
)

// Delivery is one event's delivery to one endpoint.
type Delivery struct {
	Endpoint      string     `json:"endpoint"`
	State         string     `json:"state"` // pending, delivered, failed
	Attempts      int        `json:"attempts"`
	LastAttemptAt *time.Time `json:"last_attempt_at"`
	LastStatus    *int       `json:"last_status"`
	LastError     *string    `json:"last_error"`
	NextAttemptAt *time.Time `json:"next_attempt_at"`
	DeliveredAt   *time.Time `json:"delivered_at"`
}

// StoredEvent is an event as stored, with its deliveries.
type StoredEvent struct {
	Seq        int64           `json:"seq"`
	Event      json.RawMessage `json:"event"` // the exact bytes delivered
	Deliveries []Delivery      `json:"deliveries"`
}

// EventFilter selects events: Rule (""; every rule), State (""; any, else
// events with a delivery pending, delivered or failed), Before (0: the
// newest; else events with seq below it), Limit.
type EventFilter struct {
	Rule, State string
	Before      int64
	Limit       int
}

// Events lists events newest first.
func Events(ctx context.Context, db DBTX, f EventFilter) ([]StoredEvent, error) {
	args := pgx.NamedArgs{"before": int64(math.MaxInt64), "limit": f.Limit}
	if f.Before > 0 {
		args["before"] = f.Before
	}
	q := qEvents
	switch {
	case f.Rule != "" && f.State != "":
		q, args["rule"], args["state"] = qEventsOfRuleInState, f.Rule, f.State
	case f.Rule != "":
		q, args["rule"] = qEventsOfRule, f.Rule
	case f.State != "":
		q, args["state"] = qEventsInState, f.State
	}
	rows, err := db.Query(ctx, q, args)
	if err != nil {
		return nil, fmt.Errorf("alerts: read events: %w", err)
	}
	defer rows.Close()
	out := []StoredEvent{}
	for rows.Next() {
		var id uuid.UUID
		var e StoredEvent
		var rule, subject, typ, body string
		var at time.Time
		var ds []byte
		if err := rows.Scan(&id, &e.Seq, &rule, &subject, &typ, &body, &at, &ds); err != nil {
			return nil, fmt.Errorf("alerts: read events: %w", err)
		}
		e.Event = json.RawMessage(body)
		if err := json.Unmarshal(ds, &e.Deliveries); err != nil {
			return nil, fmt.Errorf("alerts: read events: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// Redeliver makes the failed deliveries of event id pending again (every
// delivered one when none failed: a receiver that lost it), due now and
// retried for retryFor. It returns how many; 0 when all are already
// pending. ErrNotFound when there is no such event.
func Redeliver(ctx context.Context, db DBTX, id uuid.UUID, retryFor time.Duration) (int64, error) {
	var ok bool
	if err := db.QueryRow(ctx, qEventExists, id).Scan(&ok); err != nil {
		return 0, fmt.Errorf("alerts: read event: %w", err)
	}
	if !ok {
		return 0, validation.NotFound(ErrNotFound, "no alert event %q", id.String())
	}
	tag, err := db.Exec(ctx, qRedeliver, pgx.NamedArgs{"id": id, "retry_for": retryFor.Seconds()})
	if err != nil {
		return 0, fmt.Errorf("alerts: redeliver: %w", err)
	}
	return tag.RowsAffected(), nil
}
