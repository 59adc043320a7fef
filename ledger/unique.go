package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/locks"
	"github.com/tally-ledger/tally/internal/pgcopy"
	"github.com/tally-ledger/tally/internal/pguuid"
	"github.com/tally-ledger/tally/periods"
)

// A unique record says its member was active at occurred_at. The member
// counts once in that period and once in that bucket day (see DayBucket).
// A reading carries both, and the first reading written for a member and
// day is its "counted" one: under locks.UniqueMembers, the batch's
// members are found among the counted readings of their periods — in
// what the Ledger remembers of the period when unique_counts says it is
// exact (unique_cache.go), else read whole or, in a period too large to
// remember, by one index descent per member (qCountedMembers: at most a
// row per member and day, however often the member was seen) — the
// counts grow by the members and member days none held, and the batch's
// readings go in with one binary COPY, the first of each new member day
// counted. Only a period of Config.UniqueIndexAfter readings or more,
// or one whose customer's previous period of the meter had as many,
// keeps its counted readings in the member index (indexed): a smaller
// one is read whole through its streams instead.
// Streams, seqs and operation ids follow the counters' rules (a seq below
// the stream's last is a late fill: nothing was billed for it, so it only
// counts its member).

// uniqueIndexAfter is the default Config.UniqueIndexAfter: a period of
// fewer readings is read whole through its streams in well under a
// second, and fits in half the default bound on what a Ledger remembers.
const uniqueIndexAfter = 100_000

// FindingUniqueAfterClose: a member was seen in a period already closed.
const FindingUniqueAfterClose = "unique_member_after_close"

type uniqueStored struct {
	streamID int64
	seq      int64
	member   string
	at       time.Time
	final    bool
}

type uniqueApplier struct {
	*applier
	cache   *memberCache
	buckets map[string]dayBucket // each customer's last bucket day: the next reading is likely in it too
	uops    map[uuid.UUID]uniqueStored
	periods map[cmpKey]map[memberDay]int // the batch's member days by period: the first new reading's index in news
	perCM   int                          // readings per customer and meter of the batch: the size a period's member days start at
	news    []uniqueNew
	// indexAfter is Config.UniqueIndexAfter; indexed, the batch's periods
	// whose counted readings are written indexed.
	indexAfter int64
	indexed    map[cmpKey]bool
	log        *slog.Logger
}

// dayBucket is what DayBucket answered for an instant: the same for every
// instant from start to end.
type dayBucket struct{ start, end, period time.Time }

// uniqueNew is a reading to write, with the period and bucket day it
// counts in.
type uniqueNew struct {
	r           *Record
	streamID    int64
	late        bool
	period, day time.Time
	counted     bool // the first reading of its member and day
}

// key is the period g counts in.
func (g *uniqueNew) key() cmpKey {
	return cmpKey{g.r.Stream.Customer, g.r.Stream.Meter, g.period.UnixMicro()}
}

// applyUniques is Apply for the records of unique meters; operation ids
// are looked up as applyGauges does, and checkKind and earlier are as
// there.
func (l *Ledger) applyUniques(ctx context.Context, tx Tx, recs []Record, checkKind MeterKind, earlier map[uuid.UUID]MeterKind) ([]Outcome, error) {
	out, err := l.applyUniquesOnce(ctx, tx, recs, false, checkKind, earlier)
	if !errors.Is(err, errOperationTaken) {
		return out, err
	}
	if _, err := tx.Exec(ctx, qRollbackToKinds); err != nil {
		return nil, fmt.Errorf("ledger: undo the attempt: %w", err)
	}
	return l.applyUniquesOnce(ctx, tx, recs, true, "", earlier)
}

func (l *Ledger) applyUniquesOnce(ctx context.Context, tx Tx, recs []Record, lookupAll bool, checkKind MeterKind, earlier map[uuid.UUID]MeterKind) ([]Outcome, error) {
	now := l.now().UTC().Truncate(time.Microsecond)
	a := &uniqueApplier{applier: &applier{
		lookupAll: lookupAll, checkKind: checkKind, now: now, out: make([]Outcome, len(recs)), recs: normalised(recs),
		streams:   map[StreamKey]*stream{},
		calendars: map[string]periods.Schedule{}, closed: map[periodKey]bool{}, rollups: map[rollupKey]decimal.Decimal{},
		elsewhere: maps.Clone(earlier),
	}, cache: l.members, indexAfter: l.indexAfter, indexed: map[cmpKey]bool{}, log: l.log, buckets: map[string]dayBucket{}, uops: make(map[uuid.UUID]uniqueStored, len(recs)), periods: map[cmpKey]map[memberDay]int{}}
	valid := a.validateReadings()
	if len(valid) == 0 {
		return a.out, nil
	}
	var customers []string
	seenC := map[string]bool{}
	var keys []StreamKey
	var opIDs []uuid.UUID
	var lockC, lockM []string
	seenCM := map[cmKey]bool{}
	minAt := now
	for _, i := range valid {
		r := &a.recs[i]
		if !seenC[r.Stream.Customer] {
			seenC[r.Stream.Customer] = true
			customers = append(customers, r.Stream.Customer)
		}
		if cm := (cmKey{r.Stream.Customer, r.Stream.Meter}); !seenCM[cm] {
			seenCM[cm] = true
			lockC, lockM = append(lockC, cm.customer), append(lockM, cm.meter)
		}
		if _, ok := a.streams[r.Stream]; !ok {
			a.streams[r.Stream] = nil
			keys = append(keys, r.Stream)
		}
		opIDs = append(opIDs, r.OperationID)
		if r.OccurredAt.Before(minAt) {
			minAt = r.OccurredAt
		}
	}
	sort.Strings(customers)
	a.perCM = (len(valid) + len(seenCM) - 1) / len(seenCM)
	b := &pgx.Batch{}
	if !lookupAll {
		b.Queue(qSavepointKinds)
	}
	if a.checkKind != "" {
		a.queueKindsCheck(b, keys)
	}
	a.queueCustomers(b, customers, minAt)
	a.queueStreamState(b, keys)
	b.Queue(qLockCustomerMeters, locks.UniqueMembers, lockC, lockM)
	a.queueOtherKinds(b, opIDs, Unique)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("ledger: unique load: %w", err)
	}
	if a.kindsDiffer() {
		return nil, errKindsDiffer
	}
	if opIDs := a.recordable(valid); len(opIDs) > 0 {
		b = &pgx.Batch{}
		b.Queue(qUniqueByOperation, pguuid.Slice(opIDs)).Query(func(rows pgx.Rows) error {
			var op pgtype.UUID
			var s uniqueStored
			_, err := pgx.ForEachRow(rows, []any{&op, &s.streamID, &s.seq, &s.member, &s.at, &s.final}, func() error {
				s.at = s.at.UTC()
				a.uops[op.Bytes] = s
				return nil
			})
			return err
		})
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return nil, fmt.Errorf("ledger: unique load: %w", err)
		}
	}
	var cs, cq []int64
	for _, i := range valid {
		r := &a.recs[i]
		s := a.streams[r.Stream]
		if s == nil {
			return nil, fmt.Errorf("ledger: stream %+v was not created", r.Stream)
		}
		if _, ok := a.uops[r.OperationID]; !ok && r.Seq <= s.dbLastSeq {
			cs, cq = append(cs, s.id), append(cq, r.Seq)
		}
	}
	if len(cs) > 0 {
		b = &pgx.Batch{}
		b.Queue(qUniqueBySeq, cs, cq).Query(func(rows pgx.Rows) error {
			var sid, seq int64
			var op pgtype.UUID
			_, err := pgx.ForEachRow(rows, []any{&sid, &seq, &op}, func() error {
				a.see(a.byID[sid], seq, op.Bytes)
				return nil
			})
			return err
		})
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return nil, fmt.Errorf("ledger: unique load seqs: %w", err)
		}
	}
	for _, i := range valid {
		if err := a.apply(i); err != nil {
			return nil, err
		}
	}
	if err := a.write(ctx, tx); err != nil {
		return nil, err
	}
	return a.out, nil
}

func (a *uniqueApplier) apply(i int) error {
	r := &a.recs[i]
	s := a.streams[r.Stream]
	if detail, ok := a.reusedElsewhere(r, Unique); ok {
		a.conflict(i, s, ReasonOperationReused, &r.OperationID, detail)
		return nil
	}
	if prev, ok := a.uops[r.OperationID]; ok {
		if prev.streamID == s.id && prev.seq == r.Seq && prev.member == r.Member && prev.at.Equal(r.OccurredAt) && prev.final == r.Final {
			a.out[i] = Outcome{Kind: Duplicate}
			return nil
		}
		a.conflict(i, s, ReasonOperationReused, nil,
			fmt.Sprintf("operation_id %s was first recorded with other content (stream %d seq %d member %q); the first write stands",
				r.OperationID, prev.streamID, prev.seq, prev.member))
		return nil
	}
	if op, ok := s.seen[r.Seq]; ok || r.Seq == s.lastSeq {
		var existing *uuid.UUID
		if ok {
			existing = &op
		}
		a.conflict(i, s, ReasonSeqReused, existing,
			fmt.Sprintf("seq %d of this stream is already recorded under operation_id %s; the first write stands", r.Seq, op))
		return nil
	}
	late := r.Seq < s.lastSeq
	if !late {
		s.lastSeq, s.dirty = r.Seq, true
		if r.Final {
			s.finalSeq = r.Seq
		}
	}
	a.see(s, r.Seq, r.OperationID)
	a.uops[r.OperationID] = uniqueStored{streamID: s.id, seq: r.Seq, member: r.Member, at: r.OccurredAt, final: r.Final}
	bk, ok := a.buckets[r.Stream.Customer]
	if !ok || r.OccurredAt.Before(bk.start) || !r.OccurredAt.Before(bk.end) {
		var err error
		if bk.start, bk.end, bk.period, err = DayBucket(a.calendars[r.Stream.Customer], r.OccurredAt); err != nil {
			return fmt.Errorf("ledger: customer %q: %w", r.Stream.Customer, err)
		}
		a.buckets[r.Stream.Customer] = bk
	}
	start, period := bk.start, bk.period
	a.news = append(a.news, uniqueNew{r: r, streamID: s.id, late: late, period: period, day: start})
	pk := cmpKey{r.Stream.Customer, r.Stream.Meter, period.UnixMicro()}
	days := a.periods[pk]
	if days == nil {
		days = make(map[memberDay]int, a.perCM)
		a.periods[pk] = days
	}
	md := memberDay{r.Member, start.UnixMicro()}
	if _, ok := days[md]; !ok {
		days[md] = len(a.news) - 1
	}
	if a.closed[periodKey{r.Stream.Customer, period.UnixMicro()}] {
		sid, seq := s.id, r.Seq
		a.findings = append(a.findings, finding{kind: FindingUniqueAfterClose, customer: r.Stream.Customer, meter: r.Stream.Meter,
			streamID: &sid, seq: &seq, period: &period,
			detail: fmt.Sprintf("member %q was active at %s, in period %s, which is closed: it counts there, and the frozen statement stays as it was",
				r.Member, r.OccurredAt.Format(time.RFC3339Nano), period.Format(time.RFC3339))})
	}
	kind := Applied
	if late {
		kind = LateFill
	}
	a.out[i] = Outcome{Kind: kind, Period: period}
	return nil
}

func (a *uniqueApplier) write(ctx context.Context, tx Tx) error {
	b := &pgx.Batch{}
	if err := a.count(ctx, tx, b); err != nil {
		return err
	}
	var ids, seqs []int64
	var finals []*int64
	for _, s := range a.streams {
		if !s.dirty {
			continue
		}
		ids, seqs = append(ids, s.id), append(seqs, s.lastSeq)
		var f *int64
		if s.finalSeq != 0 {
			v := s.finalSeq
			f = &v
		}
		finals = append(finals, f)
	}
	if len(ids) > 0 {
		b.Queue(qUpdateStreamSeqs, ids, seqs, finals, a.now)
	}
	written := make([]periodSeq, len(a.news))
	for i, g := range a.news {
		written[i] = periodSeq{g.r.Stream.Customer, g.period, g.streamID, g.r.Seq}
	}
	queueSeqRanges(b, written)
	a.queueConflicts(b)
	a.queueFindings(b)
	if b.Len() > 0 {
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("ledger: unique write: %w", err)
		}
	}
	return a.copyReadings(ctx, tx)
}

// count decides which of the batch's member days are new, marks the first
// new reading of each counted, and queues what they add to unique_counts:
// one per new member day, and one per member new in its period. What the
// Ledger remembers of a period decides when unique_counts says it is
// exact (unique_cache.go); the members of the other periods are read
// whole (a period not indexed, or one small enough to remember) or
// looked up among their counted readings. A period this batch takes to
// Config.UniqueIndexAfter readings is indexed first (indexPeriods), and
// the counted readings of an indexed period are written indexed.
func (a *uniqueApplier) count(ctx context.Context, tx Tx, b *pgx.Batch) error {
	if len(a.periods) == 0 {
		return nil
	}
	keys := slices.Collect(maps.Keys(a.periods))
	rows, err := countVersions(ctx, tx, keys)
	if err != nil {
		return err
	}
	readings := map[cmpKey]int64{}
	for _, g := range a.news {
		readings[g.key()]++
	}
	previous, err := a.previousSpans(ctx, tx, keys, rows)
	if err != nil {
		return err
	}
	var flips []cmpKey
	for _, k := range keys {
		row, ok := rows[k]
		switch {
		case ok && row.indexed:
			a.indexed[k] = true
		case row.span+readings[k] >= a.indexAfter || previous[k] >= a.indexAfter:
			a.indexed[k] = true
			if ok {
				flips = append(flips, k)
			}
		}
	}
	sets := map[cmpKey]*memberSet{}
	if a.cache.limit > 0 {
		sets = a.cache.exact(keys, rows)
		a.cache.remembered.Add(float64(len(sets)))
	}
	if err := a.loadMembers(ctx, tx, keys, rows, sets); err != nil {
		return err
	}
	if err := a.indexPeriods(ctx, tx, flips, rows); err != nil {
		return err
	}
	a.cache.lookups.Add(float64(len(keys) - len(sets)))
	found, err := a.lookUpMembers(ctx, tx, sets)
	if err != nil {
		return err
	}
	// What the batch adds to unique_counts: a row per period and per
	// bucket day with new member days.
	var cs, ms []string
	var ps, ds []time.Time
	var perDay, indexed []bool
	var members []int64
	addCount := func(pk cmpKey, day time.Time, perDayRow bool, n int64) {
		cs, ms, ps = append(cs, pk.customer), append(ms, pk.meter), append(ps, time.UnixMicro(pk.period).UTC())
		ds, perDay, members, indexed = append(ds, day), append(perDay, perDayRow), append(members, n), append(indexed, a.indexed[pk])
	}
	added := map[cmpKey][]memberDay{}
	if len(sets) > 0 {
		a.cache.mu.Lock()
		defer a.cache.mu.Unlock()
	}
	for pk, days := range a.periods {
		s, exact := sets[pk], true
		if s == nil {
			s, exact = found[pk], false
		}
		newDays := map[int64]int64{}
		var newMembers map[string]bool
		for md, i := range days {
			inPeriod, onDay := s.held(md.member, md.day)
			if onDay {
				continue
			}
			a.news[i].counted = true
			newDays[md.day]++
			if !inPeriod && !newMembers[md.member] {
				if newMembers == nil {
					newMembers = map[string]bool{}
				}
				newMembers[md.member] = true // once in its period, whatever its new days in the batch
			}
			if exact {
				added[pk] = append(added[pk], md)
			}
		}
		if len(newDays) == 0 {
			continue
		}
		for day, n := range newDays {
			addCount(pk, time.UnixMicro(day).UTC(), true, n)
		}
		// The period's row is written whenever one of its member days is
		// new (adding 0 when the member was already counted in the
		// period): its xmin then names the last transaction that changed
		// the period's counted readings (unique_cache.go).
		addCount(pk, time.UnixMicro(pk.period).UTC(), false, int64(len(newMembers)))
	}
	if len(cs) == 0 {
		return nil
	}
	b.Queue(qAddUniqueCounts, pgx.StrictNamedArgs{"customer": cs, "meter": ms, "period_start": ps, "per_day": perDay,
		"day": ds, "members": members, "indexed": indexed}).Query(func(rows pgx.Rows) error {
		var c, m string
		var period time.Time
		var day bool
		var v countVersion
		_, err := pgx.ForEachRow(rows, []any{&c, &m, &period, &day, &v.xmin, &v.members}, func() error {
			if pk := (cmpKey{c, m, period.UnixMicro()}); !day && sets[pk] != nil && a.cache.limit > 0 {
				a.cache.counted(pk, sets[pk], v, added[pk])
			}
			return nil
		})
		return err
	})
	return nil
}

// previousSpans returns, for the keys that are new periods (no row) when
// a period can go unindexed, the seqs the meter's streams span in the
// customer's period of the meter before it: a customer whose last period
// reached Config.UniqueIndexAfter readings has its next one indexed from
// the start, so that it is not indexed again, at once, every period.
func (a *uniqueApplier) previousSpans(ctx context.Context, tx Tx, keys []cmpKey, rows map[cmpKey]periodRow) (map[cmpKey]int64, error) {
	var fresh []cmpKey
	for _, k := range keys {
		if _, ok := rows[k]; !ok && a.indexAfter > 0 {
			fresh = append(fresh, k)
		}
	}
	out := map[cmpKey]int64{}
	if len(fresh) == 0 {
		return out, nil
	}
	cs, ms, ps := keyArgs(fresh)
	got, err := tx.Query(ctx, qPreviousPeriodSpans, cs, ms, ps)
	if err != nil {
		return nil, fmt.Errorf("ledger: unique periods before: %w", err)
	}
	var c, m string
	var period time.Time
	var span int64
	_, err = pgx.ForEachRow(got, []any{&c, &m, &period, &span}, func() error {
		out[cmpKey{c, m, period.UnixMicro()}] = span
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: unique periods before: %w", err)
	}
	return out, nil
}

// periodRow is what the period row of unique_counts says of a period.
type periodRow struct {
	version    countVersion
	memberDays int64 // what reading the period whole would hold
	indexed    bool
	span       int64 // when not indexed: the seqs its streams span in it, at least its readings
}

// countVersions reads the period rows of unique_counts of keys: the
// periods with a row (the others have no readings).
func countVersions(ctx context.Context, tx Tx, keys []cmpKey) (map[cmpKey]periodRow, error) {
	cs, ms, ps := keyArgs(keys)
	rows, err := tx.Query(ctx, qUniqueCountVersions, cs, ms, ps)
	if err != nil {
		return nil, fmt.Errorf("ledger: unique counts: %w", err)
	}
	out := map[cmpKey]periodRow{}
	var c, m string
	var period time.Time
	var r periodRow
	_, err = pgx.ForEachRow(rows, []any{&c, &m, &period, &r.version.xmin, &r.version.members, &r.memberDays, &r.indexed, &r.span}, func() error {
		out[cmpKey{c, m, period.UnixMicro()}] = r
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: unique counts: %w", err)
	}
	return out, nil
}

// loadMembers reads whole the counted readings of the periods of keys
// that have some (rows) but no exact set: a period not indexed through
// its streams (fewer readings than Config.UniqueIndexAfter), an indexed
// one through the member index when its member days fit in half the
// cache's bound. It adds what it read to sets and, when the Ledger
// remembers members, to the cache.
func (a *uniqueApplier) loadMembers(ctx context.Context, tx Tx, keys []cmpKey, rows map[cmpKey]periodRow, sets map[cmpKey]*memberSet) error {
	var byStreams, byIndex []cmpKey
	loaded := map[cmpKey]*memberSet{}
	for _, k := range keys {
		row, ok := rows[k]
		switch {
		case !ok || sets[k] != nil:
			continue
		case !row.indexed:
			byStreams = append(byStreams, k)
		case row.memberDays > 0 && row.memberDays <= int64(a.cache.limit/2):
			byIndex = append(byIndex, k)
		default:
			continue
		}
		loaded[k] = newMemberSet()
		loaded[k].version = row.version
	}
	for _, q := range []struct {
		sql  string
		keys []cmpKey
	}{{qCountedInStreams, byStreams}, {qCountedInPeriods, byIndex}} {
		if len(q.keys) == 0 {
			continue
		}
		cs, ms, ps := keyArgs(q.keys)
		got, err := tx.Query(ctx, q.sql, cs, ms, ps)
		if err != nil {
			return fmt.Errorf("ledger: unique members of periods: %w", err)
		}
		var c, m, member string
		var period, day time.Time
		_, err = pgx.ForEachRow(got, []any{&c, &m, &period, &member, &day}, func() error {
			loaded[cmpKey{c, m, period.UnixMicro()}].add(memberDay{member, day.UnixMicro()})
			return nil
		})
		if err != nil {
			return fmt.Errorf("ledger: unique members of periods: %w", err)
		}
	}
	for k, s := range loaded {
		sets[k] = s
		if a.cache.limit > 0 {
			a.cache.counted(k, s, s.version, nil)
		}
	}
	a.cache.read.Add(float64(len(loaded)))
	return nil
}

// indexPeriods puts the counted readings of flips, periods not indexed
// that this batch takes to Config.UniqueIndexAfter readings, into the
// member index, once.
func (a *uniqueApplier) indexPeriods(ctx context.Context, tx Tx, flips []cmpKey, rows map[cmpKey]periodRow) error {
	if len(flips) == 0 {
		return nil
	}
	cs, ms, ps := keyArgs(flips)
	start := time.Now()
	var readings int64
	if err := tx.QueryRow(ctx, qIndexPeriods, cs, ms, ps).Scan(&readings); err != nil {
		return fmt.Errorf("ledger: index unique periods: %w", err)
	}
	a.cache.indexed.Add(float64(len(flips)))
	periods := make([]string, len(flips))
	for i, k := range flips {
		periods[i] = fmt.Sprintf("%s %s %s (%d readings)", k.customer, k.meter, ps[i].Format(time.RFC3339), rows[k].span)
	}
	a.log.Info("unique meter periods indexed: their members are looked up in the member index from now on",
		"periods", periods, "counted_readings", readings, "took", time.Since(start))
	return nil
}

// keyArgs is keys as the three arrays ($1 customers, $2 meters, $3
// periods) the statements on whole periods take.
func keyArgs(keys []cmpKey) (cs, ms []string, ps []time.Time) {
	cs, ms, ps = make([]string, len(keys)), make([]string, len(keys)), make([]time.Time, len(keys))
	for i, k := range keys {
		cs[i], ms[i], ps[i] = k.customer, k.meter, time.UnixMicro(k.period).UTC()
	}
	return cs, ms, ps
}

// lookUpMembers looks the batch's members of the periods not in exact up
// among the counted readings of their periods: for each such period, a
// set of the member days (and so of the members) already counted, among
// the batch's members.
func (a *uniqueApplier) lookUpMembers(ctx context.Context, tx Tx, exact map[cmpKey]*memberSet) (map[cmpKey]*memberSet, error) {
	found := map[cmpKey]*memberSet{}
	var cs, ms, mem []string
	var ps []time.Time
	for pk, days := range a.periods {
		if exact[pk] != nil {
			continue
		}
		found[pk] = newMemberSet()
		asked := map[string]bool{}
		for md := range days {
			if !asked[md.member] {
				asked[md.member] = true // once, whatever its days in the batch
				cs, ms, mem = append(cs, pk.customer), append(ms, pk.meter), append(mem, md.member)
				ps = append(ps, time.UnixMicro(pk.period).UTC())
			}
		}
	}
	if len(cs) == 0 {
		return found, nil
	}
	rows, err := tx.Query(ctx, qCountedMembers, cs, ms, mem, ps)
	if err != nil {
		return nil, fmt.Errorf("ledger: unique members: %w", err)
	}
	var c, m, member string
	var period, day time.Time
	_, err = pgx.ForEachRow(rows, []any{&c, &m, &member, &period, &day}, func() error {
		if s := found[cmpKey{c, m, period.UnixMicro()}]; s != nil {
			s.add(memberDay{member, day.UnixMicro()})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: unique members: %w", err)
	}
	return found, nil
}

// uniqueColumns are the columns of qCopyUniqueReadings, in order.
var uniqueColumns = []string{"stream_id", "seq", "operation_id", "customer", "meter", "member", "occurred_at",
	"final", "late_fill", "ingested_at", "period_start", "day", "counted", "indexed"}

// copyReadings writes the new readings with one binary COPY, as
// copyRecords does the counters' records, after the members were counted.
func (a *uniqueApplier) copyReadings(ctx context.Context, tx Tx) error {
	return a.copyRows(ctx, tx, "unique_readings", uniqueColumns, qCopyUniqueReadings, len(a.news), 160, func(buf []byte, i int) ([]byte, error) {
		g := &a.news[i]
		buf = appendKeyFields(buf, g.streamID, g.r)
		buf = pgcopy.Text(buf, g.r.Member)
		buf = pgcopy.Time(buf, g.r.OccurredAt)
		buf = pgcopy.Bool(buf, g.r.Final)
		buf = pgcopy.Bool(buf, g.late)
		buf = pgcopy.Time(buf, a.now)
		buf = pgcopy.Time(buf, g.period)
		buf = pgcopy.Time(buf, g.day)
		buf = pgcopy.Bool(buf, g.counted)
		return pgcopy.Bool(buf, a.indexed[g.key()]), nil
	})
}
