package ingest_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/internal/faultproxy"
)

// lease is a partition's row in ingest_partition_owners.
type lease struct {
	partition  int
	member     string
	generation int32
	process    string
	live       bool
}

func (e *env) leases() []lease {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT o.partition, coalesce(o.member, ''), o.generation, o.process,
		o.member IS NOT NULL AND coalesce(m.lease_until > now(), false)
		FROM ingest_partition_owners o
		LEFT JOIN ingest_members m ON m.topic = o.topic AND m.consumer_group = o.consumer_group AND m.member = o.member
		WHERE o.topic = $1 ORDER BY o.partition`, topic)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var out []lease
	for rows.Next() {
		var l lease
		if err := rows.Scan(&l.partition, &l.member, &l.generation, &l.process, &l.live); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

func pidOf(process string) int {
	for i := len(process) - 1; i >= 0; i-- {
		if process[i] == ':' {
			n, _ := strconv.Atoi(process[i+1:])
			return n
		}
	}
	return 0
}

// waitOwnedBy waits until every partition has a live lease and the live
// leases are spread over exactly the processes pids.
func (e *env) waitOwnedBy(timeout time.Duration, pids ...int) []lease {
	e.t.Helper()
	var ls []lease
	err := eventually(timeout, func() error {
		ls = e.leases()
		holders := map[int]bool{}
		live := 0
		for _, l := range ls {
			if l.live {
				live++
				holders[pidOf(l.process)] = true
			}
		}
		if live != e.parts || len(holders) != len(pids) {
			return fmt.Errorf("leases %+v", ls)
		}
		for _, p := range pids {
			if !holders[p] {
				return fmt.Errorf("process %d holds no partition: leases %+v", p, ls)
			}
		}
		return nil
	})
	if err != nil {
		e.t.Fatalf("partitions not owned by %v: %v", pids, err)
	}
	return ls
}

func (e *env) nextOffsets() map[int]int64 {
	e.t.Helper()
	out := map[int]int64{}
	rows, err := e.pool.Query(context.Background(), "SELECT partition, next_offset FROM ingest_partitions WHERE topic = $1", topic)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var p int
		var n int64
		if err := rows.Scan(&p, &n); err != nil {
			e.t.Fatal(err)
		}
		out[p] = n
	}
	return out
}

// childWithDefaults is e.child with ingest's default lease timings: the
// session timeout and heartbeat that a crash costs in production.
func (e *env) childWithDefaults(t *testing.T) *exec.Cmd {
	return e.child(t, childDefaultTimingsEnv+"=1")
}

const childDefaultTimingsEnv = "TALLY_TEST_CHILD_DEFAULT_TIMINGS"

// Three member processes with the default lease timings share six
// partitions under steady production; one is killed with SIGKILL. Every
// partition it owned applies a message produced after the kill within the
// lease plus a heartbeat and the new owner's start (bounded generously for
// a loaded machine; measured figures are logged), and the ledger ends exact.
func TestKilledMemberPartitionsMoveOnWithinBound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 6)
	streams := models(24)
	p := startProducer(t, e.kafka.Addrs, streams, 23, 1_000_000, 5*time.Millisecond)
	var cmds []*exec.Cmd
	var pids []int
	for range 3 {
		c := e.childWithDefaults(t)
		cmds = append(cmds, c)
		pids = append(pids, c.Process.Pid)
	}
	defer func() {
		for _, c := range cmds {
			_ = c.Process.Signal(syscall.SIGTERM)
		}
		for _, c := range cmds {
			_ = c.Wait()
		}
	}()
	ls := e.waitOwnedBy(60*time.Second, pids...)
	victim := cmds[1]
	var parts []int
	for _, l := range ls {
		if pidOf(l.process) == victim.Process.Pid {
			parts = append(parts, l.partition)
		}
	}
	tKill := time.Now()
	if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = victim.Wait()
	// Offsets at or above these were produced after the kill.
	hw := map[int]int64{}
	for _, p := range parts {
		hw[p] = e.kafka.HighWatermark(t, topic, p)
	}
	cmds = slices.Delete(cmds, 1, 2)

	// The bound: the lease (2s: it runs out), one heartbeat interval (the
	// next balancing round claims) and the new owner's start; target 5s.
	// The bound allows 10s more for a loaded machine.
	bound := ingest.DefaultSessionTimeout + ingest.DefaultHeartbeatInterval + 3*time.Second + 10*time.Second
	moved := map[int]time.Duration{}
	err := eventually(bound, func() error {
		next := e.nextOffsets()
		for _, p := range parts {
			if _, ok := moved[p]; !ok && next[p] > hw[p] {
				moved[p] = time.Since(tKill)
			}
		}
		if len(moved) < len(parts) {
			return fmt.Errorf("advanced: %v of partitions %v (stored %v, high watermarks at the kill %v)", moved, parts, next, hw)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the killed member's partitions did not move on within %v: %v", bound, err)
	}
	t.Logf("killed member %d (partitions %v); each applied a message produced after the kill after %v", victim.Process.Pid, parts, moved)
	// The survivors hold every partition now.
	e.waitOwnedBy(30*time.Second, cmds[0].Process.Pid, cmds[1].Process.Pid)

	close(p.stop)
	p.wait()
	e.waitCaughtUp(60 * time.Second)
	e.checkLedger(streams)
	e.checkOffsets()
	e.checkCounters()
}

// auditWrites records every stored-offset advance of ingest_partitions with
// the member that wrote it and when (test-only trigger).
func (e *env) auditWrites() {
	e.t.Helper()
	for _, q := range []string{
		`CREATE TABLE test_offset_writes (at timestamptz NOT NULL, partition int NOT NULL, owner text, generation int, next_offset bigint)`,
		`CREATE FUNCTION test_offset_write() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN
		   IF NEW.next_offset <> OLD.next_offset THEN
		     INSERT INTO test_offset_writes VALUES (clock_timestamp(), NEW.partition, NEW.owner, NEW.generation, NEW.next_offset);
		   END IF;
		   RETURN NEW;
		 END $$`,
		`CREATE TRIGGER test_offset_write AFTER UPDATE ON ingest_partitions FOR EACH ROW EXECUTE FUNCTION test_offset_write()`,
	} {
		if _, err := e.pool.Exec(context.Background(), q); err != nil {
			e.t.Fatal(err)
		}
	}
}

func (e *env) writesBy(member string, after time.Time) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM test_offset_writes WHERE owner = $1 AND at >= $2`,
		member, after).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// A member stopped (SIGSTOP) for longer than its session timeout while it
// consumes is evicted and its partitions move to the other member. Resumed,
// it applies nothing as the member it was (its transaction in flight was
// ended by Postgres, its compare-and-set and its lease fail), then rejoins
// the group as a new member, takes partitions again and applies them; the
// ledger ends exact and stored offsets never went back.
func TestPausedMemberIsFencedAndRejoins(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	e.auditWrites()
	streams := models(16)
	p := startProducer(t, e.kafka.Addrs, streams, 29, 1_000_000, 5*time.Millisecond)
	// a's connections are recognisable in pg_stat_activity.
	aURL, err := url.Parse(e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := aURL.Query()
	q.Set("application_name", "member-a")
	aURL.RawQuery = q.Encode()
	a, b := e.child(t, "TALLY_TEST_CHILD_DB="+aURL.String()), e.child(t)
	defer func() {
		for _, c := range []*exec.Cmd{a, b} {
			_ = c.Process.Signal(syscall.SIGCONT)
			_ = c.Process.Signal(syscall.SIGTERM)
			_ = c.Wait()
		}
	}()
	ls := e.waitOwnedBy(60*time.Second, a.Process.Pid, b.Process.Pid)
	var aMember string
	var aParts []int
	for _, l := range ls {
		if pidOf(l.process) == a.Process.Pid {
			aMember = l.member
			aParts = append(aParts, l.partition)
		}
	}
	// Let a apply something, so that it is caught mid-work.
	if err := eventually(30*time.Second, func() error {
		if e.writesBy(aMember, time.Time{}) == 0 {
			return fmt.Errorf("member %s has written nothing", aMember)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Stop a in the middle of a micro-batch transaction, holding the row
	// lock of a partition (what a member stalled by a pause, swapping or a
	// VM freeze does): b must still take the partition over.
	locked := func() bool {
		var n int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity s JOIN pg_locks l ON l.pid = s.pid
			WHERE s.application_name = 'member-a' AND s.xact_start IS NOT NULL
			  AND l.relation = 'ingest_partitions'::regclass AND l.granted`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	caught := false
	for deadline := time.Now().Add(60 * time.Second); !caught && time.Now().Before(deadline); {
		if !locked() {
			time.Sleep(time.Millisecond) // transactions take milliseconds; do not hammer Postgres
			continue
		}
		if err := a.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond) // a statement already sent completes
		if caught = locked(); caught {
			break
		}
		if err := a.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	if !caught {
		t.Fatal("never caught member a inside a transaction holding a partition's row lock")
	}
	tStop := time.Now()
	// b takes a's partitions over and applies messages produced after the
	// stop while a is stopped (a COMMIT a sent just before has landed by
	// now).
	time.Sleep(200 * time.Millisecond)
	hw := map[int]int64{}
	for _, p := range aParts {
		hw[p] = e.kafka.HighWatermark(t, topic, p)
	}
	if err := eventually(60*time.Second, func() error {
		next := e.nextOffsets()
		for _, p := range aParts {
			if next[p] <= hw[p] {
				return fmt.Errorf("partition %d: stored %d, high watermark at the stop %d", p, next[p], hw[p])
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("a stopped member's partitions did not move on: %v", err)
	}
	e.waitOwnedBy(30*time.Second, b.Process.Pid)
	t.Logf("member %s (pid %d) stopped; its partitions %v moved on after %v", aMember, a.Process.Pid, aParts, time.Since(tStop))

	tCont := time.Now()
	if err := a.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// It rejoins: both processes hold partitions again, a as a new member.
	ls = e.waitOwnedBy(60*time.Second, a.Process.Pid, b.Process.Pid)
	var aNew string
	for _, l := range ls {
		if pidOf(l.process) == a.Process.Pid {
			aNew = l.member
		}
	}
	if aNew == aMember {
		t.Errorf("the resumed member kept its evicted membership %s", aMember)
	}
	if err := eventually(30*time.Second, func() error {
		if e.writesBy(aNew, tCont) == 0 {
			return fmt.Errorf("the rejoined member %s has applied nothing", aNew)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	close(p.stop)
	p.wait()
	e.waitCaughtUp(60 * time.Second)
	if n := e.writesBy(aMember, tCont); n != 0 {
		t.Errorf("the evicted member %s advanced stored offsets %d times after it resumed", aMember, n)
	}
	e.checkLedger(streams)
	e.checkOffsets()
	e.checkCounters()
}

// A member that shuts down releases its leases; one that crashes leaves
// them to run out. Either way the status shows the partitions without an
// owner and since when, and Unowned lists them once that is old enough.
func TestUnownedPartitionsAreVisible(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	ctx := context.Background()
	m := e.start()
	e.waitOwnedBy(30*time.Second, os.Getpid())
	// A partition's status row appears once its new owner has read its
	// stored offset (just after the claim).
	if err := eventually(30*time.Second, func() error {
		st, err := ingest.Status(ctx, e.pool, topic)
		if err != nil {
			return err
		}
		if len(st) != 2 {
			return fmt.Errorf("status: %+v", st)
		}
		for _, s := range st {
			if s.OwnedBy == nil || s.OwnerProcess == nil || s.OwnedSince == nil || s.UnownedSince != nil {
				return fmt.Errorf("partition %d of a running member: owned_by %v, owner_process %v, owned_since %v, unowned_since %v",
					s.Partition, s.OwnedBy, s.OwnerProcess, s.OwnedSince, s.UnownedSince)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if u, err := ingest.Unowned(ctx, e.pool, topic, 0); err != nil || len(u) != 0 {
		t.Errorf("Unowned with a running member: %v, %v", u, err)
	}
	m.Stop(t) // releases
	st, err := ingest.Status(ctx, e.pool, topic)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if s.OwnedBy != nil || s.OwnedSince != nil || s.UnownedSince == nil {
			t.Errorf("partition %d after a clean stop: owned_by %v, owned_since %v, unowned_since %v",
				s.Partition, s.OwnedBy, s.OwnedSince, s.UnownedSince)
		}
	}
	u, err := ingest.Unowned(ctx, e.pool, topic, 0)
	if err != nil || len(u) != 2 || u[0].Since == nil {
		t.Errorf("Unowned after a clean stop: %+v, %v", u, err)
	}
	if u, err := ingest.Unowned(ctx, e.pool, topic, time.Hour); err != nil || len(u) != 0 {
		t.Errorf("Unowned for an hour, right after the stop: %+v, %v", u, err)
	}

	// A crashed member: its leases run out after the session timeout.
	c := e.child(t)
	e.waitOwnedBy(30*time.Second, c.Process.Pid)
	if err := c.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.Wait()
	if err := eventually(30*time.Second, func() error {
		u, err := ingest.Unowned(ctx, e.pool, topic, 0)
		if err != nil || len(u) != 2 {
			return fmt.Errorf("unowned %+v, %v", u, err)
		}
		return nil
	}); err != nil {
		t.Fatalf("a crashed member's partitions are not shown unowned: %v", err)
	}
}

// auditStaleWrites records every write of ingest_partitions (offsets,
// positions, retrying notes, counters) with the writer's application_name
// and the process holding the partition's lease at that instant.
func (e *env) auditStaleWrites() {
	e.t.Helper()
	for _, q := range []string{
		`CREATE TABLE test_writes (at timestamptz NOT NULL, partition int NOT NULL, app text NOT NULL, holder text)`,
		`CREATE FUNCTION test_write() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN
		   INSERT INTO test_writes
		   SELECT clock_timestamp(), NEW.partition, current_setting('application_name'),
		          (SELECT process FROM ingest_partition_owners o WHERE o.topic = NEW.topic AND o.partition = NEW.partition);
		   RETURN NEW;
		 END $$`,
		`CREATE TRIGGER test_write AFTER UPDATE ON ingest_partitions FOR EACH ROW EXECUTE FUNCTION test_write()`,
	} {
		if _, err := e.pool.Exec(context.Background(), q); err != nil {
			e.t.Fatal(err)
		}
	}
}

// A member stopped (SIGSTOP) for longer than its lease, while another member
// takes its partitions over, then resumed, writes nothing at all as the
// member it was: not a micro-batch, not an idle partition's position, not a
// retrying note (its offsets would still match, since the partitions are
// idle: only the lease fence in every write refuses them). It then joins
// again as a new member and takes its share back.
func TestMemberPausedPastItsLeaseCommitsNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	e.auditStaleWrites()
	streams := models(4)
	p := startProducer(t, e.kafka.Addrs, streams, 31, 40, 5*time.Millisecond)
	aURL, err := url.Parse(e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := aURL.Query()
	q.Set("application_name", "member-a")
	aURL.RawQuery = q.Encode()
	a := e.child(t, "TALLY_TEST_CHILD_DB="+aURL.String())
	var b *exec.Cmd
	defer func() {
		for _, c := range []*exec.Cmd{a, b} {
			if c != nil {
				_ = c.Process.Signal(syscall.SIGCONT)
				_ = c.Process.Signal(syscall.SIGTERM)
				_ = c.Wait()
			}
		}
	}()
	e.waitOwnedBy(30*time.Second, a.Process.Pid)
	p.wait()
	e.waitCaughtUp(30 * time.Second) // idle now: a touches its positions every PositionInterval

	if err := a.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	b = e.child(t)
	e.waitOwnedBy(30*time.Second, b.Process.Pid)
	// b has written its positions: a's stale writes would find the same
	// stored offsets, so only the lease can refuse them.
	time.Sleep(500 * time.Millisecond)
	tCont := time.Now()
	if err := a.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// a notices it was evicted, joins again and takes its share.
	e.waitOwnedBy(30*time.Second, a.Process.Pid, b.Process.Pid)
	time.Sleep(time.Second)
	var stale int
	var detail string
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*), coalesce(string_agg(partition || ' at ' || at || ' (holder ' || coalesce(holder, '') || ')', '; '), '')
		FROM test_writes WHERE app = 'member-a' AND at >= $1 AND coalesce(holder, '') NOT LIKE '%:' || $2`,
		tCont, strconv.Itoa(a.Process.Pid)).Scan(&stale, &detail); err != nil {
		t.Fatal(err)
	}
	if stale != 0 {
		t.Errorf("the resumed member wrote %d times to partitions another process held: %s", stale, detail)
	}
	var mine int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM test_writes WHERE app = 'member-a' AND at >= $1`,
		tCont).Scan(&mine); err != nil {
		t.Fatal(err)
	}
	if mine == 0 {
		t.Errorf("the member wrote nothing after it rejoined: the test proved nothing")
	}
	e.checkLedger(streams)
	e.checkOffsets()
	e.checkCounters()
}

// A member whose database link goes silent (a blackhole: its statements are
// held in the network) while its lease runs out and another member takes
// its partitions over, then comes back: the statements it sent while it
// still believed it held the partitions reach Postgres after the takeover,
// and every one of them is refused by the lease fence checked in the
// statement itself (the partitions are idle, so the offsets it expects still
// match: the compare-and-set alone would let them through).
func TestDelayedWritesOfAMemberWhoseLeaseWasTakenCommitNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	e.auditStaleWrites()
	streams := models(4)
	p := startProducer(t, e.kafka.Addrs, streams, 37, 40, 5*time.Millisecond)
	aURL, err := url.Parse(e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.Start(aURL.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	aURL.Host = proxy.Addr()
	q := aURL.Query()
	q.Set("application_name", "member-a")
	aURL.RawQuery = q.Encode()
	a := e.child(t, "TALLY_TEST_CHILD_DB="+aURL.String())
	var b *exec.Cmd
	defer func() {
		proxy.Pass()
		for _, c := range []*exec.Cmd{a, b} {
			if c != nil {
				_ = c.Process.Signal(syscall.SIGTERM)
				_ = c.Wait()
			}
		}
	}()
	e.waitOwnedBy(30*time.Second, a.Process.Pid)
	p.wait()
	e.waitCaughtUp(30 * time.Second) // idle now: a writes its positions every PositionInterval

	proxy.Blackhole()
	tHole := time.Now()
	b = e.child(t)
	e.waitOwnedBy(30*time.Second, b.Process.Pid)
	time.Sleep(300 * time.Millisecond)
	proxy.Pass()
	t.Logf("a's database link was silent for %v", time.Since(tHole))
	e.waitOwnedBy(30*time.Second, a.Process.Pid, b.Process.Pid)
	time.Sleep(time.Second)
	var stale int
	var detail string
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*), coalesce(string_agg(partition || ' at ' || at || ' (holder ' || coalesce(holder, '') || ')', '; '), '')
		FROM test_writes WHERE app = 'member-a' AND at >= $1 AND coalesce(holder, '') NOT LIKE '%:' || $2`,
		tHole, strconv.Itoa(a.Process.Pid)).Scan(&stale, &detail); err != nil {
		t.Fatal(err)
	}
	if stale != 0 {
		t.Errorf("member a wrote %d times to partitions another process held: %s", stale, detail)
	}
	e.checkLedger(streams)
	e.checkOffsets()
	e.checkCounters()
}

const childSessionTimeoutEnv = "TALLY_TEST_CHILD_SESSION_TIMEOUT"

// A member whose process dies stops being live when Postgres sees its
// session close, not when its lease runs out: two members with a 60s lease
// share four partitions under steady production, one is killed with
// SIGKILL, and the survivor claims and applies every partition of the dead
// one within a few seconds (the bound is a sixth of the lease, so waiting
// for the lease fails it). The ledger ends exact and no offset went back.
func TestKilledMemberPartitionsAreClaimedBeforeItsLeaseRunsOut(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	streams := models(16)
	p := startProducer(t, e.kafka.Addrs, streams, 23, 1_000_000, 5*time.Millisecond)
	const lease = 60 * time.Second
	a := e.child(t, childSessionTimeoutEnv+"="+lease.String())
	b := e.child(t, childSessionTimeoutEnv+"="+lease.String())
	defer func() {
		_ = b.Process.Signal(syscall.SIGTERM)
		_ = b.Wait()
	}()
	ls := e.waitOwnedBy(60*time.Second, a.Process.Pid, b.Process.Pid)
	var parts []int
	for _, l := range ls {
		if pidOf(l.process) == a.Process.Pid {
			parts = append(parts, l.partition)
		}
	}
	tKill := time.Now()
	if err := a.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = a.Wait()
	hw := map[int]int64{}
	for _, p := range parts {
		hw[p] = e.kafka.HighWatermark(t, topic, p)
	}
	bound := lease / 6
	moved := map[int]time.Duration{}
	err := eventually(bound, func() error {
		next := e.nextOffsets()
		for _, p := range parts {
			if _, ok := moved[p]; !ok && next[p] > hw[p] {
				moved[p] = time.Since(tKill)
			}
		}
		if len(moved) < len(parts) {
			return fmt.Errorf("advanced: %v of partitions %v (stored %v, high watermarks at the kill %v)", moved, parts, next, hw)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the killed member's partitions did not move on within %v of its %v lease: %v", bound, lease, err)
	}
	t.Logf("killed member %d (partitions %v); each applied a message produced after the kill after %v", a.Process.Pid, parts, moved)
	e.waitOwnedBy(10*time.Second, b.Process.Pid)

	close(p.stop)
	p.wait()
	e.waitCaughtUp(60 * time.Second)
	e.checkLedger(streams)
	e.checkOffsets()
	e.checkCounters()
}
