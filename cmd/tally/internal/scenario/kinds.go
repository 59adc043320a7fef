package scenario

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
)

// Gauge and unique meters (docs/design.md §16). A run's gauges are levels
// of 0 to 50 in thousandths that change by random steps of at most 5; its
// unique meters see members of a pool of uniquePool (user-0, user-1, …).
//
// A gauge stream's readings must go forward in time by seq (the ledger
// refuses one stamped before its predecessor), so each producer's
// readings of one customer's gauge are taken one at a time, each stamped
// at or after the one before. With Spread, gauge readings are stamped on
// a clock that runs from now-Spread at the start to now at the end, so
// levels span period boundaries; unique readings are spread like
// counters.
//
// The ground truth of gauges and unique meters is computed from the
// readings that reached Kafka, whatever the faults: a lost reading is not
// refilled by a later one (the level before it holds longer), and its
// member is not counted unless another reading saw it; duplicates,
// retransmits and reordering change nothing, and a wiped crash starts a
// new epoch, whose first reading of a customer's gauge ends the old
// epoch's level there. So that every level ends (and an open period's
// aggregates stop growing with time), each producer reads every
// customer's gauges once more after the load, and Close ends them with
// final records.

const (
	uniquePool = 50
	maxLevel   = 50_000 // thousandths
	maxStep    = 5_000
)

// GaugeMeters names n gauge meters: g1, g2, …
func GaugeMeters(n int) []string { return names("g", n) }

// UniqueMeters names n unique meters: u1, u2, …
func UniqueMeters(n int) []string { return names("u", n) }

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i+1)
	}
	return out
}

// DeclareMeters declares the gauge and unique meters of cfg in the ledger
// (ledger.DeclareMeter, as PUT /v1/meters does). A meter already declared
// with its kind stays as it is; one used with another kind is an error.
func DeclareMeters(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, cfg Config) error {
	if cfg.Gauges == 0 && cfg.Uniques == 0 {
		return nil
	}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		for _, m := range GaugeMeters(cfg.Gauges) {
			if _, err := ledger.DeclareMeter(ctx, tx, ledger.Meter{Meter: m, Kind: ledger.Gauge,
				Description: "tally produce: a level"}, time.Now()); err != nil {
				return err
			}
		}
		for _, m := range UniqueMeters(cfg.Uniques) {
			if _, err := ledger.DeclareMeter(ctx, tx, ledger.Meter{Meter: m, Kind: ledger.Unique,
				Description: "tally produce: distinct members"}, time.Now()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("scenario: declare the gauge and unique meters: %w", err)
	}
	return nil
}

// GaugeTotal is a gauge's aggregates for a customer and period, through
// the period's end (every level of a run ends at 0 when its producers
// close, so an open period's figures no longer change).
type GaugeTotal struct {
	Customer    string          `json:"customer"`
	Meter       string          `json:"meter"`
	Period      string          `json:"period"`
	PeriodStart time.Time       `json:"period_start"`
	Max         decimal.Decimal `json:"max"`
	Latest      decimal.Decimal `json:"latest"`
	UnitSeconds decimal.Decimal `json:"unit_seconds"`
}

// UniqueTotal is a unique meter's distinct members for a customer and
// period.
type UniqueTotal struct {
	Customer    string    `json:"customer"`
	Meter       string    `json:"meter"`
	Period      string    `json:"period"`
	PeriodStart time.Time `json:"period_start"`
	Members     int64     `json:"members"`
}

type levelKey struct{ producer, customer, meter string }

// levelStream is one producer's level of a customer's gauge.
type levelStream struct {
	mu    sync.Mutex // held across RecordLevel: one reading at a time, in time order
	level int64      // thousandths
	set   bool
	last  time.Time
}

// gaugeClock is when a gauge reading taken now is stamped: now, or with
// Spread a clock that runs from now-Spread at the start of the load to
// now at its end (by duration or records, whichever is further).
func (s *scenarioRun) gaugeClock() time.Time {
	now := time.Now().UTC()
	if s.cfg.Spread == 0 {
		return now
	}
	frac := 0.0
	if s.cfg.Duration > 0 {
		frac = float64(time.Since(s.start)) / float64(s.cfg.Duration)
	}
	if s.cfg.Records > 0 {
		frac = max(frac, float64(s.acked.Load())/float64(s.cfg.Records))
	}
	return now.Add(-time.Duration((1 - min(frac, 1)) * float64(s.cfg.Spread)))
}

// recordLevel moves g's level of customer c's gauge m by a random step
// and records it.
func (s *scenarioRun) recordLevel(ctx context.Context, g *gen, c, m string, rng *rand.Rand) error {
	ls := s.levels[levelKey{g.id, c, m}]
	ls.mu.Lock()
	defer ls.mu.Unlock()
	v := rng.Int64N(maxLevel + 1)
	if ls.set {
		v = min(max(ls.level+rng.Int64N(2*maxStep+1)-maxStep, 0), maxLevel)
	}
	level := decimal.New(v, -3)
	at := s.gaugeClock().Truncate(time.Microsecond)
	if at.Before(ls.last) {
		at = ls.last
	}
	g.mu.RLock()
	epoch := g.p.Epoch()
	err := g.p.RecordLevel(context.WithoutCancel(ctx), c, m, level, at)
	g.mu.RUnlock()
	if err != nil {
		return err
	}
	ls.level, ls.set, ls.last = v, true, at
	s.ackReading(g.id, epoch, c, m, at, level.String())
	return nil
}

// recordMember records that a random member of the pool was active.
func (s *scenarioRun) recordMember(ctx context.Context, g *gen, c, m string, rng *rand.Rand) error {
	member := fmt.Sprintf("user-%d", rng.IntN(uniquePool))
	at := time.Now().UTC()
	if s.cfg.Spread > 0 {
		at = at.Add(-time.Duration(rng.Int64N(int64(s.cfg.Spread))))
	}
	at = at.Truncate(time.Microsecond)
	g.mu.RLock()
	epoch := g.p.Epoch()
	err := g.p.RecordMember(context.WithoutCancel(ctx), c, m, member, at)
	g.mu.RUnlock()
	if err != nil {
		return err
	}
	s.ackReading(g.id, epoch, c, m, at, member)
	return nil
}

// lastLevels has every producer read every customer's gauges once more
// after the load: the last epoch of each producer then has a stream of
// each, which ends every older epoch's level, and Close ends its own.
func (s *scenarioRun) lastLevels(ctx context.Context) {
	for gi, g := range s.gens {
		rng := rand.New(rand.NewPCG(s.cfg.Seed, uint64(gi*1000+999)))
		for _, c := range s.customers {
			for _, m := range s.gauges {
				if err := s.recordLevel(ctx, g, c, m, rng); err != nil {
					s.fail(fmt.Errorf("scenario: producer %s: %w", g.id, err))
					return
				}
				s.acked.Add(1)
			}
		}
	}
}

func readingKey(producer string, epoch int64, customer, meter string, at time.Time, value string) string {
	return fmt.Sprintf("%s/%d/%s/%s at %s: %s", producer, epoch, customer, meter, at.UTC().Format(time.RFC3339Nano), value)
}

func (s *scenarioRun) ackReading(producer string, epoch int64, c, m string, at time.Time, value string) {
	s.readingsMu.Lock()
	s.readings[readingKey(producer, epoch, c, m, at, value)]++
	s.readingsMu.Unlock()
}

// crossCheckReadings compares the gauge and unique readings the producers
// acknowledged with those they sent (each seq once, final records aside):
// the same, or the producer lost or invented some.
func (s *scenarioRun) crossCheckReadings() error {
	s.t.mu.Lock()
	sent := map[string]int{}
	for k, recs := range s.t.streams {
		for _, r := range recs {
			if r.final || !r.level.Valid && r.member == "" {
				continue
			}
			v := r.member
			if r.level.Valid {
				v = r.level.Decimal.String()
			}
			sent[readingKey(k.producer, k.epoch, k.customer, k.meter, r.at, v)]++
		}
	}
	s.t.mu.Unlock()
	var problems []string
	for k, n := range s.readings {
		if sent[k] != n {
			problems = append(problems, fmt.Sprintf("%s: acknowledged %d times, sent %d", k, n, sent[k]))
		}
	}
	for k, n := range sent {
		if _, ok := s.readings[k]; !ok {
			problems = append(problems, fmt.Sprintf("%s: sent %d times, never acknowledged", k, n))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	sort.Strings(problems)
	if len(problems) > 10 {
		problems = append(problems[:10], fmt.Sprintf("and %d more", len(problems)-10))
	}
	return errors.New("scenario: the producers' gauge and unique readings differ from what they acknowledged:\n  " + strings.Join(problems, "\n  "))
}

// kindsTruth computes the gauges' aggregates and the unique meters'
// distinct members per customer and period from the readings that
// reached Kafka (gauges by the ledger's own definition, ledger.RecomputeGauge).
func kindsTruth(e *Expect, gauges map[[2]string][]ledger.GaugeReading, uniques map[[2]string][]uniqueSeen) error {
	cal := periods.DefaultCalendar()
	for k, rs := range gauges {
		first, last := rs[0].OccurredAt, rs[0].OccurredAt
		for _, r := range rs {
			first, last = minTime(first, r.OccurredAt), maxTime(last, r.OccurredAt)
		}
		p, err := cal.PeriodAt(first)
		if err != nil {
			return err
		}
		for {
			u := ledger.RecomputeGauge(rs, p.Start, p.End)
			e.Gauges = append(e.Gauges, GaugeTotal{Customer: k[0], Meter: k[1], Period: p.Name, PeriodStart: p.Start.UTC(),
				Max: u.Max, Latest: u.Latest, UnitSeconds: u.UnitSeconds})
			if !p.End.After(last) {
				if p, err = cal.PeriodAt(p.End); err != nil {
					return err
				}
				continue
			}
			if !u.Latest.IsZero() {
				return fmt.Errorf("scenario: %s/%s: the level does not end at 0 but at %s (a stream without a final reading)", k[0], k[1], u.Latest)
			}
			break
		}
	}
	type pk struct {
		customer, meter string
		start           int64
	}
	members := map[pk]map[string]bool{}
	for k, rs := range uniques {
		for _, r := range rs {
			p, err := cal.PeriodAt(r.at)
			if err != nil {
				return err
			}
			key := pk{k[0], k[1], p.Start.Unix()}
			if members[key] == nil {
				members[key] = map[string]bool{}
				e.Uniques = append(e.Uniques, UniqueTotal{Customer: k[0], Meter: k[1], Period: p.Name, PeriodStart: p.Start.UTC()})
			}
			members[key][r.member] = true
		}
	}
	for i := range e.Uniques {
		u := &e.Uniques[i]
		u.Members = int64(len(members[pk{u.Customer, u.Meter, u.PeriodStart.Unix()}]))
	}
	sort.Slice(e.Gauges, func(i, j int) bool {
		a, b := e.Gauges[i], e.Gauges[j]
		return lessKey(a.Customer, a.Meter, a.PeriodStart, b.Customer, b.Meter, b.PeriodStart)
	})
	sort.Slice(e.Uniques, func(i, j int) bool {
		a, b := e.Uniques[i], e.Uniques[j]
		return lessKey(a.Customer, a.Meter, a.PeriodStart, b.Customer, b.Meter, b.PeriodStart)
	})
	return nil
}

type uniqueSeen struct {
	member string
	at     time.Time
}

func lessKey(c1, m1 string, t1 time.Time, c2, m2 string, t2 time.Time) bool {
	if c1 != c2 {
		return c1 < c2
	}
	if m1 != m2 {
		return m1 < m2
	}
	return t1.Before(t2)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
