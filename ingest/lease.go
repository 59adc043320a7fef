package ingest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/tally-ledger/tally/internal/pause"
)

// Partition leases in Postgres (table ingest_partition_owners) mirror the
// Kafka group's assignment: a member claims each partition the group gives
// it, renews the claims every HeartbeatInterval for SessionTimeout, and
// releases them on a clean shutdown. They serve two purposes:
//   - Operators and the API see which member owns each partition and since
//     when, and a partition whose owner died is visibly unowned from the
//     moment its lease runs out.
//   - A member whose renewal no longer matches a partition (another member
//     claimed it in a newer generation) cancels that partition's work at
//     once: it stops reading and rolls back its transaction instead of
//     waiting for its Kafka heartbeat to fail. The offset compare-and-set
//     stays what makes a stale member harmless; the lease makes it quiet.

// processName identifies this process in the owners table: host:pid.
var processName = func() string {
	h, err := os.Hostname()
	if err != nil {
		h = "?"
	}
	return fmt.Sprintf("%s:%d", h, os.Getpid())
}()

// interval renders d for a Postgres interval parameter.
func interval(d time.Duration) string {
	return fmt.Sprintf("%d microseconds", d.Microseconds())
}

// leases are one generation's partition claims of this member.
type leases struct {
	c   *Consumer
	gen *kafka.Generation

	mu      sync.Mutex
	tracked map[int]trackedPartition
	seq     uint64 // counts track calls
}

// trackedPartition is a claimed partition whose work runs.
type trackedPartition struct {
	cancel context.CancelFunc // stops its work
	seq    uint64             // leases.seq when it was tracked
}

func (c *Consumer) newLeases(gen *kafka.Generation) *leases {
	return &leases{c: c, gen: gen, tracked: map[int]trackedPartition{}}
}

// claim takes partition id for this generation; it retries until it
// succeeds or ctx ends. A claim that matches no row means another member of
// the group holds a live lease of the same or a newer generation: either
// this member is stale already (its generation ends with its next
// heartbeat) or the group's generations restarted (a recreated group) and
// the old holder's lease runs out within a session timeout; it waits.
func (l *leases) claim(ctx context.Context, id int) bool {
	cfg := l.c.cfg
	refused := 0
	for attempt := 0; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, cfg.TxTimeout)
		tag, err := cfg.Pool.Exec(cctx, qClaimPartition, pgx.StrictNamedArgs{"topic": cfg.Topic, "partition": id, "member": l.gen.MemberID,
			"generation": l.gen.ID, "process": processName, "lease": interval(cfg.SessionTimeout), "group": cfg.Group})
		cancel()
		if err == nil && tag.RowsAffected() == 1 {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		d := l.c.backoff(attempt)
		if err != nil {
			l.c.m.retries.WithLabelValues("postgres").Inc()
			l.c.log.Warn("cannot claim the partition's lease; retrying", "partition", id, "err", err, "attempt", attempt+1)
		} else {
			if refused%30 == 0 {
				l.c.log.Warn("partition is leased by another member of the group (a newer or the same generation); "+
					"waiting for that lease to end", "partition", id, "generation", l.gen.ID)
			}
			refused++
			attempt, d = -1, cfg.HeartbeatInterval
		}
		if !pause.For(ctx, d) {
			return false
		}
	}
}

// track registers the cancel function of partition id's work.
func (l *leases) track(id int, cancel context.CancelFunc) {
	l.mu.Lock()
	l.seq++
	l.tracked[id] = trackedPartition{cancel: cancel, seq: l.seq}
	l.mu.Unlock()
}

// lose cancels partition id's work: another member holds it.
func (l *leases) lose(id int) {
	l.mu.Lock()
	cancel := l.tracked[id].cancel
	delete(l.tracked, id)
	l.mu.Unlock()
	if cancel != nil {
		l.c.m.leaseLost.Inc()
		l.c.log.Warn("partition claimed by another member: stopped reading and applying it", "partition", id,
			"generation", l.gen.ID)
		cancel()
	}
}

// renewLoop renews the generation's claims every HeartbeatInterval until ctx
// (the generation) ends; it must not return before then (see runPartition).
// A partition missing from a renewal's answer is lost: its work stops.
func (l *leases) renewLoop(ctx context.Context) {
	cfg := l.c.cfg
	t := time.NewTicker(cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Only partitions claimed before the renewal started can be missing
		// from its answer because they were lost (its snapshot may predate
		// a claim that committed meanwhile).
		l.mu.Lock()
		before := l.seq
		l.mu.Unlock()
		held, err := l.renew(ctx)
		if err != nil {
			if ctx.Err() == nil {
				l.c.log.Debug("cannot renew the partition leases (will retry)", "err", err)
			}
			continue
		}
		l.mu.Lock()
		var lost []int
		for id, t := range l.tracked {
			if t.seq <= before && !held[id] {
				lost = append(lost, id)
			}
		}
		l.mu.Unlock()
		for _, id := range lost {
			l.lose(id)
		}
	}
}

func (l *leases) renew(ctx context.Context) (map[int]bool, error) {
	cfg := l.c.cfg
	ctx, cancel := context.WithTimeout(ctx, cfg.HeartbeatInterval+cfg.SessionTimeout/2)
	defer cancel()
	rows, err := cfg.Pool.Query(ctx, qRenewLeases, cfg.Topic, l.gen.MemberID, l.gen.ID, interval(cfg.SessionTimeout), cfg.Group)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	held := map[int]bool{}
	for rows.Next() {
		var id int
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		held[id] = true
	}
	return held, rows.Err()
}

// holds reports whether this generation still holds partition id's lease
// (true when Postgres cannot tell: the offset compare-and-set decides then).
func (l *leases) holds(ctx context.Context, id int) bool {
	cfg := l.c.cfg
	ctx, cancel := context.WithTimeout(ctx, cfg.TxTimeout)
	defer cancel()
	var ok bool
	if err := cfg.Pool.QueryRow(ctx, qHoldsLease, cfg.Topic, id, l.gen.MemberID, l.gen.ID, cfg.Group).Scan(&ok); err != nil {
		return true
	}
	return ok
}

// release gives partition id up (clean shutdown); errors are only logged:
// the lease runs out by itself.
func (l *leases) release(id int) {
	cfg := l.c.cfg
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := cfg.Pool.Exec(ctx, qReleasePartition, cfg.Topic, id, l.gen.MemberID, l.gen.ID, cfg.Group); err != nil {
		l.c.log.Debug("cannot release the partition's lease (it runs out by itself)", "partition", id, "err", err)
	}
}

// Unowned returns the partitions of topic that have had no live owner for at
// least d (a crashed member's partitions until another member claims them;
// partitions no member has claimed since their last write), with the time
// their last lease ran out (nil if none was ever recorded).
func Unowned(ctx context.Context, db DBTX, topic string, d time.Duration) ([]UnownedPartition, error) {
	rows, err := db.Query(ctx, qSelectUnowned, topic, interval(d))
	if err != nil {
		return nil, fmt.Errorf("ingest unowned partitions: %w", err)
	}
	defer rows.Close()
	var out []UnownedPartition
	for rows.Next() {
		var u UnownedPartition
		if err := rows.Scan(&u.Partition, &u.Since); err != nil {
			return nil, fmt.Errorf("ingest unowned partitions: %w", err)
		}
		if u.Since != nil {
			t := u.Since.UTC()
			u.Since = &t
		}
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ingest unowned partitions: %w", err)
	}
	return out, nil
}

// UnownedPartition is a partition without a live owner.
type UnownedPartition struct {
	Partition int
	Since     *time.Time // when its last lease ran out; nil if never leased
}

// ownership is one partition's lease as Status reports it.
type ownership struct {
	member, process string
	since, until    time.Time
	live            bool
}

func owners(ctx context.Context, db DBTX, topic string) (map[[2]any]ownership, error) {
	rows, err := db.Query(ctx, qSelectOwners, topic)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[[2]any]ownership{}
	for rows.Next() {
		var t string
		var p int
		var member *string
		var o ownership
		if err := rows.Scan(&t, &p, &member, &o.process, &o.since, &o.until, &o.live); err != nil {
			return nil, err
		}
		if member != nil {
			o.member = *member
		}
		out[[2]any{t, p}] = o
	}
	return out, rows.Err()
}
