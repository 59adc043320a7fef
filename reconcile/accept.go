package reconcile

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// What can be accepted: a loss that no replay will undo.
const (
	AcceptDeadLetter = "dead_letter" // a dead letter that will not be replayed
	AcceptOffsetJump = "offset_jump" // messages Kafka deleted before ingest read them
)

// ErrLossNotFound: no dead letter or offset jump has the id to accept.
var ErrLossNotFound = errors.New("not found")

// ErrAlreadyReplayed: a replayed dead letter has nothing left to accept.
var ErrAlreadyReplayed = errors.New("the dead letter was replayed: nothing to accept")

// Acceptance is a person's decision that a loss stands: the dead letter or
// offset jump stops blocking closes. Nothing billed changes; the record of
// who accepted what and why is kept.
type Acceptance struct {
	Kind   string    // AcceptDeadLetter or AcceptOffsetJump
	ID     uuid.UUID // the dead letter's or the offset jump's id
	Actor  string    // who accepts (required)
	Reason string    // why (required)
	At     time.Time // default now
}

// Validate reports every problem of the acceptance.
func (a Acceptance) Validate() error {
	var errs []error
	if a.Kind != AcceptDeadLetter && a.Kind != AcceptOffsetJump {
		errs = append(errs, fmt.Errorf("kind: %q is neither %s nor %s", a.Kind, AcceptDeadLetter, AcceptOffsetJump))
	}
	if a.ID == uuid.Nil {
		errs = append(errs, errors.New("id: required"))
	}
	if a.Actor == "" {
		errs = append(errs, errors.New("actor: required (who accepts the loss)"))
	}
	if a.Reason == "" {
		errs = append(errs, errors.New("reason: required (why the loss stands)"))
	}
	return errors.Join(errs...)
}

// Accept records an acceptance. Accepting what was accepted before keeps
// the first record and succeeds.
func Accept(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, a Acceptance) error {
	if err := a.Validate(); err != nil {
		return err
	}
	if a.At.IsZero() {
		a.At = time.Now()
	}
	var exists, replayed bool
	var err error
	if a.Kind == AcceptDeadLetter {
		err = db.QueryRow(ctx, qDeadLetterReplayed, a.ID).Scan(&exists, &replayed)
	} else {
		err = db.QueryRow(ctx, qOffsetJumpExists, a.ID).Scan(&exists, &replayed)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%s %s %w", strings.ReplaceAll(a.Kind, "_", " "), a.ID, ErrLossNotFound)
	}
	if err != nil {
		return fmt.Errorf("reconcile: accept: %w", err)
	}
	if replayed {
		return fmt.Errorf("dead letter %s: %w", a.ID, ErrAlreadyReplayed)
	}
	if _, err := db.Exec(ctx, qAcceptanceInsert, a.Kind, a.ID, a.Actor, a.Reason, a.At.UTC().Truncate(time.Microsecond)); err != nil {
		return fmt.Errorf("reconcile: accept: %w", err)
	}
	return nil
}
