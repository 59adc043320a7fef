package api

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/internal/ids"
)

// ingestStatusView answers GET /v1/ingest/status: the stored position and
// conservation counters of every partition of the API's topic.
type ingestStatusView struct {
	Topic      string                   `json:"topic"`
	Partitions []ingest.PartitionStatus `json:"partitions"`
	// NotificationQueueUsage is pg_notification_queue_usage() (see
	// internal/notify).
	NotificationQueueUsage float64 `json:"notification_queue_usage"`
}

func (a *API) getIngestStatus(w http.ResponseWriter, r *http.Request) error {
	if _, err := queryParams(r); err != nil {
		return err
	}
	ps, err := ingest.Status(r.Context(), a.pool, a.topic)
	if err != nil {
		return err
	}
	if ps == nil {
		ps = []ingest.PartitionStatus{}
	}
	view := ingestStatusView{Topic: a.topic, Partitions: ps}
	if err := a.pool.QueryRow(r.Context(), qNotifyQueueUsage).Scan(&view.NotificationQueueUsage); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, view)
	return nil
}

// maxDeadLetterRows is the most ingest.ListDeadLetters returns at once.
const maxDeadLetterRows = 1000

func (a *API) listDeadLetters(w http.ResponseWriter, r *http.Request) error {
	q, err := queryParams(r, "customer", "pending", "limit", "cursor")
	if err != nil {
		return err
	}
	pr, errs := parsePage(r, q)
	f := ingest.DeadLetterFilter{Customer: q["customer"]}
	if c, ok := q["customer"]; ok && !ids.Valid(c) {
		errs = append(errs, FieldError{Field: "customer", Detail: quote(c) + " is not 1-128 characters of A-Z a-z 0-9 . _ : -"})
	}
	if s, ok := q["pending"]; ok {
		b, err := strconv.ParseBool(s)
		if err != nil || (s != "true" && s != "false") {
			errs = append(errs, FieldError{Field: "pending", Detail: quote(s) + " is not true or false"})
		}
		f.Pending = b
	}
	if len(pr.After) == 1 {
		id, err := uuid.Parse(pr.After[0])
		if err != nil {
			errs = append(errs, FieldError{Field: "cursor", Detail: notACursor})
		}
		f.After = id
	} else if pr.After != nil {
		errs = append(errs, FieldError{Field: "cursor", Detail: notACursor})
	}
	if len(errs) > 0 {
		sortFieldErrors(errs)
		return invalid(errs...)
	}
	// One row more than asked says whether there is a next page; ingest
	// returns at most maxDeadLetterRows, so a full page of that size always
	// gets a cursor (the next page may then be empty).
	f.Limit = min(pr.Limit+1, maxDeadLetterRows)
	rows, err := ingest.ListDeadLetters(r.Context(), a.pool, f)
	if err != nil {
		return err
	}
	key := func(d ingest.DeadLetter) []string { return []string{d.ID.String()} }
	page := NewPage(rows, pr, key)
	if len(rows) == pr.Limit && pr.Limit >= maxDeadLetterRows {
		page.NextCursor = pr.Cursor(key(rows[len(rows)-1])...)
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// pathUUID reads a UUID path parameter.
func pathUUID(r *http.Request, name string) (uuid.UUID, error) {
	return parseUUID(name, chi.URLParam(r, name))
}

// parseUUID reads field name's value s as a UUID in its 36-character form.
func parseUUID(name, s string) (uuid.UUID, error) {
	id, err := uuid.Parse(s)
	if err != nil || len(s) != 36 {
		return uuid.Nil, invalidField(name, "%s is not a UUID", quote(s))
	}
	return id, nil
}

func (a *API) getDeadLetter(w http.ResponseWriter, r *http.Request) error {
	id, err := pathUUID(r, "id")
	if err != nil {
		return err
	}
	if _, err := queryParams(r); err != nil {
		return err
	}
	d, err := ingest.GetDeadLetter(r.Context(), a.pool, id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, d)
	return nil
}

// replayDeadLetter runs a dead letter through the decoder and the ledger
// again. 200 either way: replayed true (its usage is booked, at most once
// however often this is called) or false (refused again, still pending,
// detail says why). A dead letter replayed before answers 409.
func (a *API) replayDeadLetter(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	id, err := pathUUID(r, "id")
	if err != nil {
		return err
	}
	if _, err := queryParams(r); err != nil {
		return err
	}
	res, err := a.replay(ctx, id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// replay replays dead letter id in one transaction and forgets the cached
// usage it may change.
func (a *API) replay(ctx context.Context, id uuid.UUID) (ingest.ReplayResult, error) {
	var res ingest.ReplayResult
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		var err error
		res, err = ingest.Replay(ctx, tx, a.ledger, id, a.now().UTC().Truncate(time.Microsecond))
		return err
	})
	a.forgetUsage("") // a replayed message may hold usage of any customer
	return res, err
}
