package ingest

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/ingest/wire"
	"github.com/tally-ledger/tally/ledger"
)

// Errors of the dead-letter functions.
var (
	ErrDeadLetterNotFound = errors.New("dead letter not found")
	ErrAlreadyReplayed    = errors.New("dead letter was already replayed")
)

// DeadLetter is input that ingest refused, with its exact bytes.
type DeadLetter struct {
	ID          uuid.UUID `json:"id"`
	Topic       string    `json:"topic"`
	Partition   int32     `json:"partition"`
	Offset      int64     `json:"offset"`
	RecordIndex *int32    `json:"record_index"` // nil: the whole message was refused
	Reason      string    `json:"reason"`
	Field       string    `json:"field,omitempty"`
	Detail      string    `json:"detail"`
	// Key is the message key (the customer id, if it was one) and Raw the
	// refused bytes (the message value, or the record's JSON), as text:
	// nil for a null key or value (a Kafka tombstone), "" for an empty
	// one, invalid UTF-8 replaced by U+FFFD. When that replacement changed
	// them, KeyBase64 and RawBase64 hold the exact bytes.
	Key           *string    `json:"key"`
	Raw           *string    `json:"raw"`
	KeyBase64     string     `json:"key_base64,omitempty"`
	RawBase64     string     `json:"raw_base64,omitempty"`
	Producer      *string    `json:"producer,omitempty"`
	Epoch         *int64     `json:"epoch,omitempty"`
	CreatedAt     time.Time  `json:"created_at"`
	ReplayedAt    *time.Time `json:"replayed_at"`
	ReplayOutcome *string    `json:"replay_outcome"`

	key, raw []byte // exactly as stored (nil: NULL), for Replay
}

// DeadLetterFilter selects dead letters; results are ordered by id
// (arrival), and After is the cursor: the last id of the previous page.
type DeadLetterFilter struct {
	Customer string    // only this message key; empty: all
	Pending  bool      // only those not replayed yet
	After    uuid.UUID // cursor
	Limit    int       // default 100, at most 1000
}

// ListDeadLetters returns a page of dead letters.
func ListDeadLetters(ctx context.Context, db DBTX, f DeadLetterFilter) ([]DeadLetter, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	f.Limit = min(f.Limit, 1000)
	args := []any{f.After, f.Limit}
	q := qSelectDeadLetters
	switch {
	case f.Customer != "" && f.Pending:
		q, args = qSelectDeadLettersOfKeyPending, append(args, f.Customer)
	case f.Customer != "":
		q, args = qSelectDeadLettersOfKey, append(args, f.Customer)
	case f.Pending:
		q = qSelectDeadLettersPending
	}
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("ingest: dead letters: %w", err)
	}
	return pgx.CollectRows(rows, scanDeadLetter)
}

// GetDeadLetter returns one dead letter.
func GetDeadLetter(ctx context.Context, db DBTX, id uuid.UUID) (DeadLetter, error) {
	rows, err := db.Query(ctx, qSelectDeadLetter, id)
	if err != nil {
		return DeadLetter{}, fmt.Errorf("ingest: dead letter: %w", err)
	}
	d, err := pgx.CollectExactlyOneRow(rows, scanDeadLetter)
	if errors.Is(err, pgx.ErrNoRows) {
		return d, ErrDeadLetterNotFound
	}
	return d, err
}

func scanDeadLetter(row pgx.CollectableRow) (DeadLetter, error) {
	var d DeadLetter
	err := row.Scan(&d.ID, &d.Topic, &d.Partition, &d.Offset, &d.RecordIndex, &d.Reason, &d.Field, &d.Detail,
		&d.key, &d.raw, &d.Producer, &d.Epoch, &d.CreatedAt, &d.ReplayedAt, &d.ReplayOutcome)
	d.Key, d.KeyBase64 = shownBytes(d.key)
	d.Raw, d.RawBase64 = shownBytes(d.raw)
	return d, err
}

// shownBytes returns b as text (nil for nil) and, when b is not valid
// UTF-8, its exact bytes in base64.
func shownBytes(b []byte) (*string, string) {
	if b == nil {
		return nil, ""
	}
	s := string(b)
	if utf8.ValidString(s) {
		return &s, ""
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	return &s, base64.StdEncoding.EncodeToString(b)
}

// ReplayResult says what replaying a dead letter did.
type ReplayResult struct {
	DeadLetter DeadLetter     `json:"dead_letter"`
	Outcomes   map[string]int `json:"outcomes"` // by outcome kind
	Replayed   bool           `json:"replayed"` // false: refused again, still pending
	Detail     string         `json:"detail"`
}

// Replay runs a dead letter's bytes through the decoder and the ledger
// again, inside tx (after a fix: a corrected clock, a calendar, a bug).
// When nothing is refused this time the dead letter is marked replayed;
// otherwise it stays pending with the new refusal noted. Its usage is
// billed at most once however often it is replayed: operation ids make a
// second replay a duplicate. Replays do not change the partition's
// ingest counters, which describe what arrived from Kafka.
func Replay(ctx context.Context, tx pgx.Tx, l *ledger.Ledger, id uuid.UUID, now time.Time) (ReplayResult, error) {
	rows, err := tx.Query(ctx, qLockDeadLetter, id)
	if err != nil {
		return ReplayResult{}, fmt.Errorf("ingest: replay: %w", err)
	}
	d, err := pgx.CollectExactlyOneRow(rows, scanDeadLetter)
	if errors.Is(err, pgx.ErrNoRows) {
		return ReplayResult{}, ErrDeadLetterNotFound
	}
	if err != nil {
		return ReplayResult{}, fmt.Errorf("ingest: replay: %w", err)
	}
	res := ReplayResult{DeadLetter: d, Outcomes: map[string]int{}}
	if d.ReplayedAt != nil {
		return res, ErrAlreadyReplayed
	}

	value := d.raw
	if d.RecordIndex != nil {
		if d.Producer == nil || d.Epoch == nil {
			return res, fmt.Errorf("ingest: replay: dead letter %s is a record without its message header", id)
		}
		// The record alone, wrapped in a message with its original header.
		env := map[string]any{"schema": wire.Schema, "batch_id": uuid.Must(uuid.NewV7()), "producer": *d.Producer,
			"epoch": *d.Epoch, "sent_at": now.UTC().Format(time.RFC3339Nano), "records": []json.RawMessage{json.RawMessage(d.raw)}}
		if value, err = json.Marshal(env); err != nil {
			res.Detail = "refused again: the stored record is not JSON"
			return res, markAttempt(ctx, tx, &res, id)
		}
	}
	b, _, rejected, err := wire.Decode(d.key, value)
	if err != nil {
		res.Outcomes[ledger.Rejected.String()]++
		if we, ok := errors.AsType[*wire.Error](err); ok {
			err = ownPlace(*we, d.RecordIndex)
		}
		res.Detail = "refused again: " + err.Error()
		return res, markAttempt(ctx, tx, &res, id)
	}
	var why []string
	for _, r := range rejected {
		res.Outcomes[ledger.Rejected.String()]++
		why = append(why, ownPlace(r.Err, d.RecordIndex).Error())
	}
	recs := make([]ledger.Record, len(b.Records))
	for i := range b.Records {
		recs[i] = ledger.FromWire(&b, i)
	}
	if len(recs) > 0 {
		outs, err := l.Apply(ctx, tx, recs)
		if err != nil {
			return res, fmt.Errorf("ingest: replay: %w", err)
		}
		for _, o := range outs {
			res.Outcomes[o.Kind.String()]++
			if o.Kind == ledger.Rejected {
				why = append(why, o.Reason+": "+o.Detail)
			}
		}
	}
	if len(why) > 0 {
		res.Detail = "refused again: " + strings.Join(why, "; ")
		return res, markAttempt(ctx, tx, &res, id)
	}
	res.Replayed, res.Detail = true, summarize(res.Outcomes)
	if _, err := tx.Exec(ctx, qMarkReplayed, id, now, res.Detail); err != nil {
		return res, fmt.Errorf("ingest: replay: %w", err)
	}
	res.DeadLetter.ReplayedAt, res.DeadLetter.ReplayOutcome = &now, &res.Detail
	return res, nil
}

// markAttempt notes res.Detail, why the replay was refused again, on the
// dead letter and in the answer's copy of it.
func markAttempt(ctx context.Context, tx pgx.Tx, res *ReplayResult, id uuid.UUID) error {
	outcome := wire.Text(res.Detail)
	res.DeadLetter.ReplayOutcome = &outcome
	_, err := tx.Exec(ctx, qMarkReplayAttempt, id, outcome)
	return err
}

// ownPlace is e with a record's path (records[0], as the replay wraps a
// record dead letter alone in a message) at the record's place in the
// message it came in, as its dead letter's field names it.
func ownPlace(e wire.Error, index *int32) wire.Error {
	if index != nil && strings.HasPrefix(e.Field, "records[0]") {
		e.Field = fmt.Sprintf("records[%d]", *index) + strings.TrimPrefix(e.Field, "records[0]")
	}
	return e
}

func summarize(outcomes map[string]int) string {
	var parts []string
	for k, n := range outcomes {
		parts = append(parts, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
