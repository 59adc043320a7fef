package ingest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// Partition assignment through leases in Postgres (docs/design.md §9). The
// broker's group coordinator plays no part: a member's failure or restart
// pauses only that member's partitions, whatever the coordinator does.
//
//   - Each member registers a row in ingest_members under a random id and
//     renews its lease every HeartbeatInterval for SessionTimeout, both
//     through one connection it holds for its life (its session, whose
//     backend pid the row records). A member is live while its lease has not
//     run out and its session exists: a member whose process died is not
//     live from the moment Postgres sees its connection close, without
//     waiting for the lease; the lease bounds a member stopped or cut off
//     without its connection closing. A member whose renewal finds its lease
//     ran out (it was stopped or starved that long), or whose session was
//     lost, was evicted: it stops all its partitions and registers again
//     under a new id.
//   - Every half HeartbeatInterval, and as soon as another member's lease
//     runs out, a member also balances: it counts the live
//     members, computes every member's fair share of the topic's partitions
//     (members sorted by id; the first P mod N take one more), claims free
//     partitions (released, or held by a member that is not live) up to its
//     share, and releases its surplus (the partitions it claimed last first,
//     so that those it held before keep running) while a live member holds
//     less than its share and nothing is free. A partition this member has seen free
//     for two rounds, that nobody under its share took, is claimed beyond
//     the share.
//   - A claim bumps the partition's fencing epoch. Every write of a
//     partition checks (member, epoch) and the member's liveness in the same
//     transaction and share-locks the owners row until it commits (see
//     qLeaseHeld): a member whose partition was claimed commits nothing, and
//     a claim waits for the previous holder's transaction to end (ending a
//     stalled one's session after a session timeout).
//   - A clean shutdown finishes the in-flight transactions, releases every
//     partition and deletes the member's row, so successors claim at once.

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

// lease is a claim of one partition: the member and the claim's fencing
// epoch.
type lease struct {
	member string
	epoch  int32
}

// running is a claimed partition whose work runs.
type running struct {
	lease     lease
	claimedAt time.Time
	cancel    context.CancelFunc
	done      chan struct{}
}

// assigner is one member's membership and partition leases.
type assigner struct {
	c          *Consumer
	metadataAt time.Time         // when the partition count was last read (balancing only)
	freeSince  map[int]time.Time // when this member first saw each partition free (balancing only)

	// session is the connection the member registered and renews through
	// (its backend pid is in the member's row); only the heartbeat uses it,
	// and leave once the heartbeat has stopped.
	session *pgx.Conn

	mu         sync.Mutex
	member     string    // current member id; "" before registration
	renewedAt  time.Time // last successful renewal (this process's clock)
	renewErr   error     // the last renewal's error, nil once one succeeds
	balanced   bool      // a balancing round completed since registration
	partitions int       // the topic's partition count, 0 until known
	running    map[int]*running
	stalled    map[int]time.Time // partition → retrying since, while it is stalled
	balanceErr error             // the last balancing round's error, nil once one succeeds
}

func newAssigner(c *Consumer) *assigner {
	return &assigner{c: c, running: map[int]*running{}, stalled: map[int]time.Time{}, freeSince: map[int]time.Time{}}
}

func (a *assigner) currentMember() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.member
}

// heartbeatLoop registers the member and renews its lease every
// HeartbeatInterval until ctx ends. It runs apart from balancing, so a claim
// waiting for a row lock never delays a renewal.
func (a *assigner) heartbeatLoop(ctx context.Context) {
	cfg := a.c.cfg
	t := time.NewTicker(cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		a.heartbeat(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (a *assigner) heartbeat(ctx context.Context) {
	cfg := a.c.cfg
	member := a.currentMember()
	args := pgx.StrictNamedArgs{"topic": cfg.Topic, "group": cfg.Group, "member": member,
		"lease": interval(cfg.SessionTimeout)}
	if member != "" && a.session != nil {
		// A renewal may take as long as the lease has left: a timed-out
		// statement closes the session, which ends the member anyway.
		a.mu.Lock()
		left := cfg.SessionTimeout - time.Since(a.renewedAt)
		a.mu.Unlock()
		rctx, cancel := context.WithTimeout(ctx, max(left, cfg.HeartbeatInterval))
		rows, err := a.session.Query(rctx, qRenewMember, args)
		n := 0
		if err == nil {
			for rows.Next() {
				n++
			}
			rows.Close()
			err = rows.Err()
		}
		cancel()
		if err == nil && n == 1 {
			a.renewed(nil)
			return
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !a.session.IsClosed():
			a.renewed(err)
			a.c.log.Warn("cannot renew the member's lease (will retry)", "member", member, "err", err)
			return
		case err != nil:
			// Other members see this member's session gone: it is not live
			// and its partitions may be claimed already.
			a.c.m.evictions.Inc()
			a.c.log.Warn("this member's session to Postgres was lost: stopping its partitions and joining again as a new member",
				"member", member, "err", err)
		default:
			// The lease ran out before this renewal: the member was evicted
			// and its partitions may belong to others already.
			a.c.m.evictions.Inc()
			a.c.log.Warn("this member's lease ran out (the process was stopped or starved for a session timeout): "+
				"stopping its partitions and joining again as a new member", "member", member, "session_timeout", cfg.SessionTimeout)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.SessionTimeout/2)
	defer cancel()
	a.mu.Lock()
	a.member = "" // the old id is dead either way: its partitions stop
	a.mu.Unlock()
	if err := a.register(ctx, args); err != nil {
		a.renewed(err)
		a.c.log.Warn("cannot register the member (will retry)", "err", err)
		return
	}
	a.renewed(nil)
}

// register opens a new session and registers a new member id through it.
func (a *assigner) register(ctx context.Context, args pgx.StrictNamedArgs) error {
	cfg := a.c.cfg
	a.closeSession()
	conn, err := cfg.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	a.session = conn.Hijack() // held for the member's life, outside the pool
	id := uuid.NewString()
	args["member"], args["process"] = id, processName
	if _, err := a.session.Exec(ctx, qRegisterMember, args); err != nil {
		a.closeSession()
		return err
	}
	a.mu.Lock()
	a.member, a.balanced = id, false
	a.mu.Unlock()
	a.c.log.Info("member registered", "member", id, "process", processName)
	return nil
}

// closeSession ends the member's session (other members see it gone).
func (a *assigner) closeSession() {
	if a.session == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = a.session.Close(ctx)
	a.session = nil
}

func (a *assigner) renewed(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.renewErr = err
	if err == nil {
		a.renewedAt = time.Now()
	}
}

// balanceLoop balances every half HeartbeatInterval, and just after
// another member's lease runs out, until ctx ends.
func (a *assigner) balanceLoop(ctx context.Context) {
	every := a.c.cfg.HeartbeatInterval / 2
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		wake, err := a.balance(ctx)
		if ctx.Err() != nil {
			return
		}
		a.mu.Lock()
		was := a.balanceErr
		a.balanceErr = err
		a.mu.Unlock()
		// Once when balancing starts failing and once when it works again:
		// a Kafka or database outage is not a line every round.
		switch {
		case err != nil && was == nil:
			a.c.log.Warn("cannot balance the partitions (Kafka or Postgres unreachable?); retrying", "every", every, "err", err)
		case err != nil:
			a.c.log.Debug("cannot balance the partitions (will retry)", "err", err)
		case was != nil:
			a.c.log.Info("partitions balanced again")
		}
		if wake <= 0 || wake > every {
			wake = every
		}
		t.Reset(wake)
	}
}

// slot is one partition as a balancing round sees it.
type slot struct {
	partition int
	lease     lease
	live      bool          // its holder is live
	left      time.Duration // until its holder's lease runs out
}

// balance is one round: stop what this member lost, claim up to its share,
// release its surplus. wake is when another member's lease runs out, if
// any does (0: none known).
func (a *assigner) balance(ctx context.Context) (wake time.Duration, err error) {
	cfg := a.c.cfg
	a.reap()
	member := a.currentMember()
	if member == "" {
		a.stopAll("")
		return 0, nil
	}
	// Partitions of a member whose lease this process may have lost are
	// stopped: they could not commit anyway.
	a.mu.Lock()
	stale := time.Since(a.renewedAt) >= cfg.SessionTimeout
	a.mu.Unlock()
	a.stopAll(member)
	if stale {
		a.stopAll("")
		return 0, nil
	}
	n, err := a.partitionCount(ctx)
	if err != nil {
		return 0, err
	}
	qctx, cancel := context.WithTimeout(ctx, cfg.TxTimeout)
	defer cancel()
	slots, members, err := a.read(qctx, n)
	if err != nil {
		return 0, err
	}
	mine := map[int]lease{}
	held := map[string]int{}
	var free []slot
	now := time.Now()
	for _, s := range slots {
		switch {
		case s.live:
			if s.lease.member != member && (wake == 0 || s.left < wake) {
				wake = s.left + 10*time.Millisecond // claim just after it runs out
			}
			held[s.lease.member]++
			if s.lease.member == member {
				mine[s.partition] = s.lease
			}
			delete(a.freeSince, s.partition)
		default:
			free = append(free, s)
			if _, ok := a.freeSince[s.partition]; !ok {
				a.freeSince[s.partition] = now
			}
		}
	}
	// Lost: running here, but the owners row names another claim.
	a.mu.Lock()
	var lost, idle []int
	for id, r := range a.running {
		if l, ok := mine[id]; !ok || l != r.lease {
			lost = append(lost, id)
		}
	}
	for id := range mine {
		if _, ok := a.running[id]; !ok {
			idle = append(idle, id) // held, but its work ended by itself: run it again
		}
	}
	a.mu.Unlock()
	for _, id := range idle {
		a.start(id, mine[id])
	}
	for _, id := range lost {
		a.c.m.leaseLost.Inc()
		a.c.log.Warn("partition claimed by another member: stopped reading and applying it", "partition", id)
		a.stop(id)
	}
	shares := fairShares(members, len(slots))
	share, ok := shares[member]
	if !ok {
		return wake, nil // not live in this snapshot: the next renewal decides
	}
	have := len(mine)
	// Claim free partitions up to the share; beyond it only those nobody
	// under its share took for two rounds.
	for _, s := range free {
		if have >= share && now.Sub(a.freeSince[s.partition]) < 2*cfg.HeartbeatInterval {
			continue
		}
		epoch, ok, err := a.claim(ctx, s.partition, member)
		if err != nil {
			return 0, err
		}
		if ok {
			have++
			a.start(s.partition, lease{member: member, epoch: epoch})
		}
	}
	// Release the surplus while another live member is under its share and
	// nothing is free for it.
	if have > share && len(free) == 0 {
		under := false
		for m, sh := range shares {
			if m != member && held[m] < sh {
				under = true
			}
		}
		if under {
			ids := a.newestFirst(mine)
			for _, id := range ids[:have-share] {
				a.release(id)
			}
		}
	}
	a.mu.Lock()
	a.balanced = true
	owned := len(a.running)
	a.mu.Unlock()
	a.c.m.owned.Set(float64(owned))
	return wake, nil
}

// newestFirst orders the partitions of mine that run here by claim, the
// latest first (then by id, highest first).
func (a *assigner) newestFirst(mine map[int]lease) []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	ids := make([]int, 0, len(mine))
	for id := range mine {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool {
		var ti, tj time.Time
		if r := a.running[ids[i]]; r != nil {
			ti = r.claimedAt
		}
		if r := a.running[ids[j]]; r != nil {
			tj = r.claimedAt
		}
		if !ti.Equal(tj) {
			return ti.After(tj)
		}
		return ids[i] > ids[j]
	})
	return ids
}

// fairShares gives each member (sorted by id) its share of n partitions:
// n/N each, one more for the first n mod N.
func fairShares(members []string, n int) map[string]int {
	out := map[string]int{}
	if len(members) == 0 {
		return out
	}
	for i, m := range members {
		out[m] = n / len(members)
		if i < n%len(members) {
			out[m]++
		}
	}
	return out
}

// partitionCount is the topic's partition count from Kafka's metadata,
// asked at most every ten rounds once known; the owners rows of new
// partitions are created.
func (a *assigner) partitionCount(ctx context.Context) (int, error) {
	cfg := a.c.cfg
	a.mu.Lock()
	known := a.partitions
	a.mu.Unlock()
	if known > 0 && time.Since(a.metadataAt) < 10*cfg.HeartbeatInterval {
		return known, nil
	}
	mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	md, err := a.c.client.Metadata(mctx, &kafka.MetadataRequest{Topics: []string{cfg.Topic}})
	if err != nil {
		if known > 0 {
			return known, nil
		}
		return 0, fmt.Errorf("topic metadata: %w", err)
	}
	n := 0
	for _, t := range md.Topics {
		if t.Name == cfg.Topic && t.Error == nil {
			n = len(t.Partitions)
		}
	}
	if n == 0 {
		if known > 0 {
			return known, nil
		}
		return 0, fmt.Errorf("topic %s: no partitions in the metadata", cfg.Topic)
	}
	a.metadataAt = time.Now()
	if n != known {
		if _, err := cfg.Pool.Exec(mctx, qEnsureOwners, pgx.StrictNamedArgs{"topic": cfg.Topic, "group": cfg.Group, "partitions": n}); err != nil {
			return 0, fmt.Errorf("owners rows: %w", err)
		}
		a.mu.Lock()
		a.partitions = n
		a.mu.Unlock()
	}
	return n, nil
}

// read returns the topic's partitions below n as slots, and the live
// members sorted by id.
func (a *assigner) read(ctx context.Context, n int) ([]slot, []string, error) {
	cfg := a.c.cfg
	args := pgx.StrictNamedArgs{"topic": cfg.Topic, "group": cfg.Group}
	rows, err := cfg.Pool.Query(ctx, qSelectAssignment, args)
	if err != nil {
		return nil, nil, err
	}
	var slots []slot
	for rows.Next() {
		var s slot
		var leftMs int64
		if err := rows.Scan(&s.partition, &s.lease.member, &s.lease.epoch, &s.live, &leftMs); err != nil {
			rows.Close()
			return nil, nil, err
		}
		s.left = time.Duration(leftMs) * time.Millisecond
		if s.partition < n {
			slots = append(slots, s)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	rows, err = cfg.Pool.Query(ctx, qSelectLiveMembers, args)
	if err != nil {
		return nil, nil, err
	}
	members, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return slots, members, err
}

// claim takes partition id for member; ok is false when a live member holds
// it. The claim waits for a transaction of the previous holder that still
// share-locks the owners row; one stalled that long (a stopped process
// mid-statement) has its session ended after a session timeout.
func (a *assigner) claim(ctx context.Context, id int, member string) (epoch int32, ok bool, err error) {
	cfg := a.c.cfg
	ctx, cancel := context.WithTimeout(ctx, cfg.TxTimeout)
	defer cancel()
	conn, err := cfg.Pool.Acquire(ctx)
	if err != nil {
		return 0, false, err
	}
	defer conn.Release()
	pid := conn.Conn().PgConn().PID()
	breaker := time.AfterFunc(cfg.SessionTimeout, func() { a.c.endBlockers(pid) })
	defer breaker.Stop()
	err = conn.QueryRow(ctx, qClaimPartition, pgx.StrictNamedArgs{"topic": cfg.Topic, "partition": id, "group": cfg.Group,
		"member": member, "process": processName}).Scan(&epoch)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("claim partition %d: %w", id, err)
	}
	a.c.m.claims.Inc()
	a.c.log.Info("partition claimed", "partition", id, "member", member, "epoch", epoch)
	return epoch, true, nil
}

// start runs partition id's work under l.
func (a *assigner) start(id int, l lease) {
	ctx, cancel := context.WithCancel(a.c.runCtx)
	r := &running{lease: l, claimedAt: time.Now(), cancel: cancel, done: make(chan struct{})}
	a.mu.Lock()
	a.running[id] = r
	a.mu.Unlock()
	go func() {
		defer close(r.done)
		a.c.runPartition(ctx, a, id, l)
	}()
}

// stop ends partition id's work and waits for it (an in-flight transaction
// is rolled back at once).
func (a *assigner) stop(id int) *running {
	a.mu.Lock()
	r := a.running[id]
	delete(a.running, id)
	delete(a.stalled, id)
	a.mu.Unlock()
	if r != nil {
		r.cancel()
		<-r.done
		a.c.m.stalled.WithLabelValues(fmt.Sprint(id)).Set(0) // the next owner reports its own state
	}
	return r
}

// stopAll stops every partition not running as member ("": all).
func (a *assigner) stopAll(member string) {
	a.mu.Lock()
	var ids []int
	for id, r := range a.running {
		if member == "" || r.lease.member != member {
			ids = append(ids, id)
		}
	}
	a.mu.Unlock()
	for _, id := range ids {
		a.stop(id)
	}
}

// reap forgets partitions whose work ended by itself (it found its lease
// gone when a write was fenced).
func (a *assigner) reap() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, r := range a.running {
		select {
		case <-r.done:
			delete(a.running, id)
			delete(a.stalled, id)
		default:
		}
	}
}

// release stops partition id's work, then gives the partition up so that
// another member claims it at once. Errors are only logged: the lease runs
// out with the member's anyway.
func (a *assigner) release(id int) {
	r := a.stop(id)
	if r == nil {
		return
	}
	cfg := a.c.cfg
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := cfg.Pool.Exec(ctx, qReleasePartition, pgx.StrictNamedArgs{"topic": cfg.Topic, "partition": id, "group": cfg.Group,
		"member": r.lease.member, "epoch": r.lease.epoch}); err != nil {
		a.c.log.Debug("cannot release the partition's lease (it runs out with the member's)", "partition", id, "err", err)
		return
	}
	a.c.m.releases.Inc()
	a.c.log.Info("partition released", "partition", id, "epoch", r.lease.epoch)
}

// leave releases every partition (their work has finished) and ends the
// member's lease: a clean shutdown.
func (a *assigner) leave() {
	a.mu.Lock()
	ids := make([]int, 0, len(a.running))
	for id := range a.running {
		ids = append(ids, id)
	}
	member := a.member
	a.mu.Unlock()
	for _, id := range ids {
		a.release(id)
	}
	if member == "" {
		a.closeSession()
		return
	}
	cfg := a.c.cfg
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := cfg.Pool.Exec(ctx, qLeaveMember, pgx.StrictNamedArgs{"topic": cfg.Topic, "group": cfg.Group, "member": member}); err != nil {
		a.c.log.Debug("cannot end the member's lease (it runs out by itself)", "err", err)
	}
	a.closeSession()
}

// holds reports whether l still holds partition id with a live lease (true
// when Postgres cannot tell: the fence in every write decides then).
func (c *Consumer) holds(ctx context.Context, id int, l lease) bool {
	cfg := c.cfg
	ctx, cancel := context.WithTimeout(ctx, cfg.TxTimeout)
	defer cancel()
	var ok bool
	if err := cfg.Pool.QueryRow(ctx, qHoldsLease, pgx.StrictNamedArgs{"topic": cfg.Topic, "partition": id, "group": cfg.Group,
		"member": l.member, "epoch": l.epoch}).Scan(&ok); err != nil {
		return true
	}
	return ok
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
