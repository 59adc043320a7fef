package ledger

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// A Ledger remembers the members it counted in a customer's period of a
// unique meter, so that a micro-batch whose members are all known, or all
// new, does not look them up in unique_readings (an index probe per
// member). What it remembers is only a hint, checked in every
// transaction against the period's row of unique_counts:
//
//   - every transaction that counts a member or a member day in a period
//     writes that period's row (adding 0 members when only a day is new),
//     so the row's xmin names the last transaction that changed the
//     period's counted readings, and its members how many there are;
//   - a set is used only when the row, read under locks.UniqueMembers
//     (which every writer of the period's readings holds until it
//     commits), carries the xmin and the members the set was left with:
//     no other transaction, of this process or another, changed the
//     period since. A transaction that rolled back leaves the row as it
//     was before it and so never matches what the set recorded from it;
//   - a period without a row has no counted readings: its set starts
//     empty, and exact.
//
// Any other case (another writer, a rollback, a process that started
// after the period's first member, a set evicted for room) forgets the
// set and reads the period's counted readings whole: a period not
// indexed (fewer readings than Config.UniqueIndexAfter) through its
// streams, an indexed one in one range of unique_readings_counted (at
// most a row per member and day) when they fit in half the bound; else
// the batch's members are looked up one by one in that index, as if
// nothing were remembered. What is remembered never decides a count on
// its own.
//
// Memory is bounded by the member days held (memberCacheLimit); past it,
// whole sets are dropped.

// memberCacheLimit is the default bound on member days remembered: about
// 40 bytes each beside the member itself (52–54 for 10-character
// members: BenchmarkMemberSetBytes).
const memberCacheLimit = 1_000_000

// periodKey with its meter.
type cmpKey struct {
	customer, meter string
	period          int64 // unix micro
}

// countVersion is what a period's unique_counts row said when a set was
// last known exact: the xmin of its latest version and its members.
type countVersion struct {
	xmin, members int64
}

type memberSet struct {
	version countVersion
	first   map[string]int64       // member → a bucket day it is counted in (unix micro): the first one added
	more    map[memberDay]struct{} // the member's other days
}

// size is the member days s holds.
func (s *memberSet) size() int { return len(s.first) + len(s.more) }

func newMemberSet() *memberSet {
	return &memberSet{first: map[string]int64{}, more: map[memberDay]struct{}{}}
}

type memberCache struct {
	mu    sync.Mutex
	limit int
	size  int // member days of sets
	sets  map[cmpKey]*memberSet
	// periods counts the periods of micro-batches by how their members
	// were found: remembered, read (the period's counted readings,
	// whole) or looked up (member by member).
	periods                   *prometheus.CounterVec
	remembered, read, lookups prometheus.Counter
	// indexed counts the periods whose counted readings a micro-batch
	// put into the member index (Config.UniqueIndexAfter).
	indexed prometheus.Counter
}

func newMemberCache(limit int) *memberCache {
	c := &memberCache{limit: limit, sets: map[cmpKey]*memberSet{}}
	c.periods = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tally_ledger_unique_periods_total",
		Help: "Periods of unique meters in micro-batches (rolled back ones too), by how their members were found: remembered (what this process counted, checked against unique_counts), read (the period's counted readings, whole: after a restart, a rebalance or another writer) or looked_up (member by member: the period is too large to remember).",
	}, []string{"how"})
	c.remembered, c.read, c.lookups = c.periods.WithLabelValues("remembered"), c.periods.WithLabelValues("read"),
		c.periods.WithLabelValues("looked_up")
	c.indexed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tally_ledger_unique_periods_indexed_total",
		Help: "Periods of unique meters whose counted readings a micro-batch put into the member index, once each, on reaching ledger.Config.UniqueIndexAfter readings (rolled back ones too); the partition's ingest waits for it.",
	})
	return c
}

// register adds the cache's metrics to reg.
func (c *memberCache) register(reg prometheus.Registerer) error {
	held := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tally_ledger_unique_member_days",
		Help: "Member days of unique meters this process remembers (bounded by ledger.Config.UniqueMemberDays).",
	}, func() float64 { // Prometheus's sample type; a count of member days, exact below 2^53
		c.mu.Lock()
		defer c.mu.Unlock()
		return float64(c.size)
	})
	for _, m := range []prometheus.Collector{c.periods, c.indexed, held} {
		if err := reg.Register(m); err != nil {
			return err
		}
	}
	return nil
}

// exact returns the sets of keys that are exact given the current rows of
// unique_counts (rows: the keys whose period row exists), creating empty
// ones for keys without a row, and forgets the others. The caller holds
// locks.UniqueMembers for every key's customer and meter, and calls it only
// when the cache remembers anything (limit > 0).
func (c *memberCache) exact(keys []cmpKey, rows map[cmpKey]periodRow) map[cmpKey]*memberSet {
	out := make(map[cmpKey]*memberSet, len(keys))
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		row, ok := rows[k]
		s := c.sets[k]
		switch {
		case !ok:
			c.drop(k)
			out[k] = newMemberSet()
		case s != nil && s.version == row.version:
			out[k] = s
		default:
			c.drop(k)
		}
	}
	return out
}

// held reports whether member was counted in s's period (inPeriod) and on
// day. The caller holds c.mu (sets are handed from one transaction to the
// next through it).
func (s *memberSet) held(member string, day int64) (inPeriod, onDay bool) {
	first, ok := s.first[member]
	switch {
	case !ok:
		return false, false
	case first == day:
		return true, true
	}
	_, onDay = s.more[memberDay{member, day}]
	return true, onDay
}

// counted keeps s for k at version v, with the member days added (those
// the transaction counted in it, none for a set read whole from the
// database).
func (c *memberCache) counted(k cmpKey, s *memberSet, v countVersion, added []memberDay) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drop(k)
	for _, m := range added {
		s.add(m)
	}
	s.version = v
	c.keep(k, s)
}

// keep holds s for k, within the bound: past it, other sets are dropped
// until a quarter of the room is free, and s is not kept if it is larger
// than the bound on its own. The caller holds c.mu and dropped k.
func (c *memberCache) keep(k cmpKey, s *memberSet) {
	c.sets[k] = s
	c.size += s.size()
	if c.size <= c.limit {
		return
	}
	for other := range c.sets {
		if c.size <= c.limit*3/4 {
			break
		}
		if other != k {
			c.drop(other)
		}
	}
	if c.size > c.limit {
		c.drop(k)
	}
}

// add adds a member day; adding one s holds changes nothing.
func (s *memberSet) add(m memberDay) {
	switch first, ok := s.first[m.member]; {
	case !ok:
		s.first[m.member] = m.day
	case first != m.day:
		s.more[m] = struct{}{}
	}
}

func (c *memberCache) drop(k cmpKey) {
	if s := c.sets[k]; s != nil {
		c.size -= s.size()
		delete(c.sets, k)
	}
}

type memberDay struct {
	member string
	day    int64
}
