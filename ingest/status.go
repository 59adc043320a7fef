package ingest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// DBTX is what Status needs: a pool, a connection or a transaction.
type DBTX interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Counters are a partition's conservation counters (docs/design.md §3): RecordsIn
// always equals Applied + Duplicate + Conflict + LateFill + Rejected.
type Counters struct {
	MessagesIn       int64 `json:"messages_in"`
	MessagesRejected int64 `json:"messages_rejected"` // refused whole; their records are not counted
	RecordsIn        int64 `json:"records_in"`
	Applied          int64 `json:"applied"`
	Duplicate        int64 `json:"duplicate"`
	Conflict         int64 `json:"conflict"`
	LateFill         int64 `json:"late_fill"`
	Rejected         int64 `json:"rejected"`
}

// Balanced reports whether records in equals the sum of outcomes.
func (c Counters) Balanced() bool {
	return c.RecordsIn == c.Applied+c.Duplicate+c.Conflict+c.LateFill+c.Rejected
}

// PartitionStatus is the stored ingest position of one partition.
type PartitionStatus struct {
	Topic         string `json:"topic"`
	Partition     int    `json:"partition"`
	NextOffset    int64  `json:"next_offset"`
	HighWatermark int64  `json:"high_watermark"` // as last seen by the consumer
	// Lag is HighWatermark - NextOffset (never below 0): messages not yet
	// applied, as of UpdatedAt.
	Lag int64 `json:"lag"`
	// AppliedThrough: usage is complete through this instant; nil before
	// the first message.
	AppliedThrough *time.Time `json:"applied_through"`
	Counters       Counters   `json:"counters"`
	Owner          string     `json:"owner,omitempty"`      // the member that wrote last
	Generation     int32      `json:"generation,omitempty"` // the fencing epoch of its claim of the partition
	UpdatedAt      time.Time  `json:"updated_at"`
	// State is "consuming", "retrying" (its micro-batch failed and is
	// being retried since RetryingSince) or "stalled" (retrying for longer
	// than StallAfter: its usage is not being applied). LastError is the
	// last failure while retrying.
	State         string     `json:"state"`
	RetryingSince *time.Time `json:"retrying_since"`
	LastError     string     `json:"last_error,omitempty"`
	// OwnedBy is the ingest member that holds the partition's lease now,
	// OwnerProcess its host:pid and OwnedSince when it claimed the
	// partition; all null while no live member holds it. UnownedSince is
	// then when the last lease ran out or was released (null if the
	// partition was never leased).
	OwnedBy      *string    `json:"owned_by"`
	OwnerProcess *string    `json:"owner_process"`
	OwnedSince   *time.Time `json:"owned_since"`
	UnownedSince *time.Time `json:"unowned_since"`
}

// Status returns every partition's stored position and counters, for topic
// or (topic "") for all topics, ordered by topic and partition.
func Status(ctx context.Context, db DBTX, topic string) ([]PartitionStatus, error) {
	rows, err := db.Query(ctx, qSelectStatus, topic, StallAfter.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("ingest status: %w", err)
	}
	defer rows.Close()
	var out []PartitionStatus
	for rows.Next() {
		var s PartitionStatus
		var owner *string
		var gen *int32
		c := &s.Counters
		if err := rows.Scan(&s.Topic, &s.Partition, &s.NextOffset, &s.HighWatermark, &s.AppliedThrough,
			&c.MessagesIn, &c.MessagesRejected, &c.RecordsIn, &c.Applied, &c.Duplicate,
			&c.Conflict, &c.LateFill, &c.Rejected, &owner, &gen, &s.UpdatedAt,
			&s.State, &s.RetryingSince, &s.LastError); err != nil {
			return nil, fmt.Errorf("ingest status: %w", err)
		}
		if owner != nil {
			s.Owner = *owner
		}
		if gen != nil {
			s.Generation = *gen
		}
		s.Lag = max(s.HighWatermark-s.NextOffset, 0)
		if s.AppliedThrough != nil {
			t := s.AppliedThrough.UTC()
			s.AppliedThrough = &t
		}
		s.UpdatedAt = s.UpdatedAt.UTC()
		if s.RetryingSince != nil {
			t := s.RetryingSince.UTC()
			s.RetryingSince = &t
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ingest status: %w", err)
	}
	rows.Close()
	own, err := owners(ctx, db, topic)
	if err != nil {
		return nil, fmt.Errorf("ingest status: owners: %w", err)
	}
	for i := range out {
		s := &out[i]
		o, ok := own[[2]any{s.Topic, s.Partition}]
		switch {
		case ok && o.live:
			since := o.since.UTC()
			s.OwnedBy, s.OwnerProcess, s.OwnedSince = &o.member, &o.process, &since
		case ok:
			until := o.until.UTC()
			s.UnownedSince = &until
		}
	}
	return out, nil
}
