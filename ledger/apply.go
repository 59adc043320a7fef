package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	pgxdecimal "github.com/jackc/pgx-shopspring-decimal"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/internal/pguuid"
	"github.com/tally-ledger/tally/periods"
)

// Config configures a Ledger.
type Config struct {
	// Clock is the ledger's notion of now: it decides future timestamps
	// and the hour a prior-period adjustment is booked in (never its
	// period: that is the first one not closed). Default time.Now.
	Clock func() time.Time
	// Logger receives the ledger's logs. Default: discard.
	Logger *slog.Logger
	// UniqueMemberDays bounds the member days of unique meters a Ledger
	// remembers, so that it need not look members up in the database
	// when it knows a period's members exactly (about 40 bytes each beside
	// the member itself: 52–54 for 10-character members).
	// 0: 1,000,000; negative: none, every member is looked up.
	UniqueMemberDays int
	// UniqueIndexAfter is how many readings a period of a unique meter
	// holds before its members go into the member index of
	// unique_readings (docs/design.md §16): below it, a Ledger that does
	// not remember the period reads its readings whole, through its
	// streams, instead of the index. The batch that takes a period to it
	// indexes the period's counted readings once; a period whose
	// customer's previous period of the meter reached it is indexed from
	// its first reading.
	// 0: 100,000; negative: every period is indexed from its first reading.
	UniqueIndexAfter int
	// Registerer, when set, receives the ledger's metrics
	// (tally_ledger_unique_*).
	Registerer prometheus.Registerer
}

// Validate reports configuration problems (none today; kept for symmetry
// with the other packages' Config).
func (c Config) Validate() error { return nil }

// Ledger applies usage records and adjustments to the Postgres ledger.
// Everything lives in the database, so any number of Ledgers (and
// processes) may share it; what a Ledger remembers between calls is only a
// hint that every transaction checks (otherKinds).
type Ledger struct {
	now func() time.Time
	log *slog.Logger
	// otherKinds: a gauge or unique meter was declared when a transaction
	// last looked (kinds never go back to none: a declared meter is never
	// deleted). Until then a counter batch reads whether one is, instead of
	// looking its operation ids up in those kinds' readings (see load).
	otherKinds atomic.Bool
	// members: the members counted in periods of unique meters
	// (unique_cache.go).
	members *memberCache
	// indexAfter: Config.UniqueIndexAfter, resolved (0: from the first
	// reading).
	indexAfter int64
}

// New returns a Ledger.
func New(cfg Config) (*Ledger, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	limit := cfg.UniqueMemberDays
	if limit == 0 {
		limit = memberCacheLimit
	}
	l := &Ledger{now: cfg.Clock, log: cfg.Logger, members: newMemberCache(limit), indexAfter: int64(max(cfg.UniqueIndexAfter, 0))}
	if cfg.UniqueIndexAfter == 0 {
		l.indexAfter = uniqueIndexAfter
	}
	if cfg.Registerer != nil {
		if err := l.members.register(cfg.Registerer); err != nil {
			return nil, err
		}
	}
	if l.now == nil {
		l.now = time.Now
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	return l, nil
}

// Tx is the transaction Apply and Adjust work in: a pgx.Tx, or a
// connection inside a transaction block its caller began and will end
// itself (ingest begins and commits in pipelines of its own statements, so
// that neither costs a round trip of its own).
type Tx interface {
	DBTX
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	// Conn is the connection the transaction runs on (for COPY).
	Conn() *pgx.Conn
}

// Apply applies a micro-batch of records inside tx and returns one outcome
// per record, in order. The result is exactly what applying the records one
// at a time, in order, would give. It needs READ COMMITTED (Postgres's
// default) and a handful of round trips whatever the batch size. It takes
// a savepoint in tx (a subtransaction: callers apply one batch per
// transaction) and, in the rare case load describes, rolls back to it.
//
// An error is a store error (or an inconsistency in stored state), never
// bad input: bad input is an outcome. After an error the caller must roll
// tx back.
func (l *Ledger) Apply(ctx context.Context, tx Tx, recs []Record) ([]Outcome, error) {
	return l.applyKinds(ctx, tx, recs)
}

// applyCounters is Apply for records of counter meters. With checkKind
// Counter, its first load also reads the kinds of the records' meters (see
// kinds.go) and returns errKindsDiffer, after the savepoint, when one is not
// a counter. earlier holds the operation ids of earlier records of the same
// Apply call that are of another kind (see applyKinds).
func (l *Ledger) applyCounters(ctx context.Context, tx Tx, recs []Record, checkKind MeterKind, earlier map[uuid.UUID]MeterKind) ([]Outcome, error) {
	out, err := l.apply(ctx, tx, recs, false, checkKind, earlier)
	if !errors.Is(err, errOperationTaken) {
		return out, err
	}
	// A record past its stream's last seq reused a recorded operation id
	// (see load): undo the attempt and apply the batch again, every
	// operation id looked up. Rare: a producer reusing ids across streams,
	// or two batches sending one new id at once.
	l.log.Info("ledger: a new record's operation id was already recorded; applying the batch again with every operation id looked up",
		"records", len(recs), "err", err)
	if _, err := tx.Exec(ctx, qRollbackToApply); err != nil {
		return nil, fmt.Errorf("ledger: undo the attempt: %w", err)
	}
	return l.apply(ctx, tx, recs, true, "", earlier)
}

// errOperationTaken: the records' COPY met a recorded operation id.
var errOperationTaken = errors.New("ledger: a new record's operation id is already recorded")

// apply is one attempt at Apply; lookupAll looks every operation id up
// before anything is written (see load).
func (l *Ledger) apply(ctx context.Context, tx Tx, recs []Record, lookupAll bool, checkKind MeterKind, earlier map[uuid.UUID]MeterKind) ([]Outcome, error) {
	now := l.now().UTC().Truncate(time.Microsecond)
	out := make([]Outcome, len(recs))
	a := &applier{
		lookupAll:  lookupAll,
		checkKind:  checkKind,
		otherKinds: &l.otherKinds,
		now:        now,
		out:        out,
		recs:       normalised(recs),
		streams:    map[StreamKey]*stream{},
		ops:        make(map[uuid.UUID]int32, len(recs)),
		calendars:  map[string]periods.Schedule{},
		closed:     map[periodKey]bool{},
		rollups:    map[rollupKey]decimal.Decimal{},
		elsewhere:  maps.Clone(earlier),
	}
	valid := a.validate()
	if len(valid) == 0 {
		return out, nil
	}
	a.newRecords = make([]newRecord, 0, len(valid))
	if err := a.load(ctx, tx, valid); err != nil {
		return nil, err
	}
	for _, i := range valid {
		if err := a.apply(i); err != nil {
			return nil, err
		}
	}
	a.endRuns()
	if err := a.write(ctx, tx); err != nil {
		return nil, err
	}
	return out, nil
}

// stream is one stream's state while a batch is applied.
type stream struct {
	id        int64
	key       StreamKey
	dbLastSeq int64 // as loaded: seqs above it cannot be recorded yet
	lastSeq   int64
	lastTotal decimal.Decimal
	finalSeq  int64
	dirty     bool
	seen      map[int64]uuid.UUID // recorded seqs <= dbLastSeq among the batch's candidates, plus the batch's own
	gaps      []*gap              // open gaps touching the batch's candidates, plus new ones
	run       billingRun
}

// billingRun is where a stream's in-order records have been going: a
// micro-batch's records of one stream mostly occurred within one hour, so
// a record that occurred within the run's span is billed to its period
// and bucket without looking them up again. What the run's records billed
// goes to the hourly rollup when the run ends (endRun): each record bills
// its total minus the stream's last, and only they move the stream's last
// total while the run lasts, so together they bill the stream's last total
// minus the one before the run, with no sum kept per record.
type billingRun struct {
	from, to       time.Time // occurred_at in [from, to) is billed here
	period, bucket time.Time
	base           decimal.Decimal // the stream's last total before the run
	set            bool
}

func (r *billingRun) covers(t time.Time) bool {
	return r.set && !t.Before(r.from) && t.Before(r.to)
}

type gap struct {
	from, to      int64
	lower, upper  decimal.Decimal
	upperQuantity decimal.NullDecimal
	// unmoved is how much of the gap's usage is still billed in
	// billedPeriod and may move out: at most its neighbours' difference,
	// shared with the gaps it was split from (see migration 00009).
	unmoved      decimal.Decimal
	billedPeriod time.Time
	billedBucket time.Time
	billedClosed bool
	fromDB       bool // exists in the gaps table (delete it if it changes)
	gone         bool // filled or split: no longer this shape
	// upperFill: the record above the gap is a late fill whose own
	// quantity was unknown when it arrived (upperQuantity not Valid). The
	// fill of the gap's last seq tells it: it then moves to the fill's own
	// period (lateFill).
	upperFill *fillPlace
}

// fillPlace is where a late fill belongs: its operation, seq, time, and
// its own period and bucket (closed: that period is).
type fillPlace struct {
	op             uuid.UUID
	seq            int64
	occurredAt     time.Time
	period, bucket time.Time
	closed         bool
}

// stored is the content of a recorded operation, for duplicate detection.
type stored struct {
	streamID   int64
	seq        int64
	total      decimal.Decimal
	quantity   decimal.NullDecimal
	occurredAt time.Time
	final      bool
}

type periodKey struct {
	customer string
	start    int64 // unix micro
}

// rollupKey is an hourly rollup's key, or a daily one's (bucket is then
// the date's midnight UTC).
type rollupKey struct {
	customer, meter string
	period, bucket  int64 // unix micro
}

type applier struct {
	lookupAll bool // look up every operation id, not only those of records at or below their stream's last seq
	// checkKind: read the meters' kinds in load (kinds.go) and give the
	// batch back unless every one is this kind ("": no check).
	checkKind  MeterKind
	otherKinds *atomic.Bool // the Ledger's hint
	kindsRead  map[string]MeterKind
	kindMeters []string
	now        time.Time
	out        []Outcome
	recs       []Record
	streams    map[StreamKey]*stream
	lastStream *stream // see streamOf
	byID       map[int64]*stream
	perStream  int // records of the batch per stream, on average: what a stream's maps start at
	// ops holds the operation ids recorded, in the store or earlier in the
	// batch: i >= 0 is the batch's record a.recs[i], i < 0 the stored
	// operation a.loaded[-1-i]. An index, not the operation: a micro-batch
	// of 5,000 records makes a map a fifth of the size (see op).
	ops    map[uuid.UUID]int32
	loaded []stored
	// elsewhere: the batch's operation ids that a record of another kind
	// holds, recorded or earlier in the same Apply call (see kinds.go).
	elsewhere map[uuid.UUID]MeterKind
	calendars map[string]periods.Schedule
	closed    map[periodKey]bool
	// lastPeriod is each customer's period last found by periodOf.
	lastPeriod map[string]periods.Period

	newRecords []newRecord
	entries    []entry
	conflicts  []conflictRow
	findings   []finding
	rollups    map[rollupKey]decimal.Decimal
}

type newRecord struct {
	rec         *Record
	streamID    int64
	lateFill    bool
	billed      decimal.Decimal
	period      time.Time
	bucket      time.Time
	priorPeriod *time.Time
}

type entry struct {
	id          uuid.UUID
	requestHash []byte
	kind        string
	operationID uuid.UUID
	customer    string
	meter       string
	amount      decimal.Decimal
	period      time.Time
	bucket      time.Time
	priorPeriod *time.Time
	occurredAt  time.Time
	reason      *string
	actor       *string
	streamID    *int64
	seq         *int64
}

type conflictRow struct {
	reason     string
	rec        *Record
	streamID   int64
	existingOp *uuid.UUID
}

type finding struct {
	kind     string
	customer string
	meter    string
	streamID *int64
	seq      *int64
	period   *time.Time
	amount   *decimal.Decimal
	detail   string
}

// Finding kinds the ledger records while applying.
const (
	FindingQuantityMismatch = "quantity_mismatch"
	FindingNotReattributed  = "late_fill_not_reattributed"
)

// validate normalises the records and rejects those Apply cannot take,
// returning the indexes of the rest.
func (a *applier) validate() []int {
	valid := make([]int, 0, len(a.recs))
	for i := range a.recs {
		r := &a.recs[i]
		if err := r.check(); err != nil {
			a.out[i] = Outcome{Kind: Rejected, Reason: ReasonInvalid, Detail: err.Error()}
			continue
		}
		if r.OccurredAt.After(a.now.Add(MaxClockSkew)) {
			a.out[i] = Outcome{Kind: Rejected, Reason: ReasonFutureTimestamp,
				Detail: fmt.Sprintf("occurred_at %s is more than %s ahead of the ledger clock (%s)",
					r.OccurredAt.Format(time.RFC3339Nano), MaxClockSkew, a.now.Format(time.RFC3339))}
			continue
		}
		valid = append(valid, i)
	}
	return valid
}

// normalised returns recs when every OccurredAt is already in UTC and in
// whole microseconds (Postgres keeps microseconds), as ingest gives them,
// and otherwise a copy of recs in which they are: Apply never
// changes its caller's records, and a micro-batch of decoded records is not
// copied (a copy of 5,000 records is a megabyte to write and to collect).
func normalised(recs []Record) []Record {
	for i := range recs {
		if t := recs[i].OccurredAt; t != t.UTC().Truncate(time.Microsecond) {
			out := slices.Clone(recs)
			for j := i; j < len(out); j++ {
				out[j].OccurredAt = out[j].OccurredAt.UTC().Truncate(time.Microsecond)
			}
			return out
		}
	}
	return recs
}

// check is Apply's own guard; the wire decoder gives friendlier errors first.
func (r *Record) check() error {
	var errs []error
	if r.OperationID == uuid.Nil {
		errs = append(errs, errors.New("operation_id: missing"))
	}
	if r.Stream.Producer == "" || r.Stream.Customer == "" || r.Stream.Meter == "" {
		errs = append(errs, errors.New("stream: producer, customer and meter are required"))
	}
	if r.Stream.Epoch < 1 {
		errs = append(errs, fmt.Errorf("epoch: %d is not positive", r.Stream.Epoch))
	}
	if r.Seq < 1 {
		errs = append(errs, fmt.Errorf("seq: %d is not positive", r.Seq))
	}
	if r.Total.Sign() < 0 {
		errs = append(errs, fmt.Errorf("total: %s is negative", r.Total))
	} else if err := amount.Check(r.Total); err != nil {
		errs = append(errs, fmt.Errorf("total: %w", err))
	}
	if r.Quantity.Valid {
		if r.Quantity.Decimal.Sign() < 0 {
			errs = append(errs, fmt.Errorf("quantity: %s is negative", r.Quantity.Decimal))
		} else if err := amount.Check(r.Quantity.Decimal); err != nil {
			errs = append(errs, fmt.Errorf("quantity: %w", err))
		}
	}
	if r.OccurredAt.IsZero() {
		errs = append(errs, errors.New("occurred_at: missing"))
	}
	return errors.Join(errs...)
}

// load reads, in pipelined round trips, everything the batch needs:
// calendars, closed periods, stream state (locked), and the recorded
// operations, seqs and gaps the batch could collide with.
//
// A recorded operation's seq is at most its stream's last seq, so only a
// record at or below its stream's last seq can repeat one with identical
// content (a duplicate); only those records' operation ids are looked up,
// after the stream state, and a batch of new records reads nothing per
// record. A record past its stream's last seq whose id is recorded anyway
// (reused across streams: a conflict) is caught by the unique key on
// operation_id when the records are written: the attempt is undone to the
// savepoint taken here, and Apply runs again with lookupAll, which looks
// every id up first, as one load always did. Outcomes are the same either
// way.
func (a *applier) load(ctx context.Context, tx Tx, valid []int) error {
	var customers []string
	seenCustomer := map[string]bool{}
	var keys []StreamKey
	var opIDs []uuid.UUID
	minOccurred := a.now
	var last *StreamKey // the records come mostly in runs of one stream
	for _, i := range valid {
		r := &a.recs[i]
		if last == nil || r.Stream != *last {
			last = &r.Stream
			if !seenCustomer[r.Stream.Customer] {
				seenCustomer[r.Stream.Customer] = true
				customers = append(customers, r.Stream.Customer)
			}
			if _, ok := a.streams[r.Stream]; !ok {
				a.streams[r.Stream] = nil
				keys = append(keys, r.Stream)
			}
		}
		opIDs = append(opIDs, r.OperationID)
		if r.OccurredAt.Before(minOccurred) {
			minOccurred = r.OccurredAt
		}
	}
	sort.Strings(customers)

	b := &pgx.Batch{}
	if !a.lookupAll {
		b.Queue(qSavepointApply)
	}
	if a.checkKind != "" {
		a.queueKindsCheck(b, keys)
	}
	a.queueCustomers(b, customers, minOccurred)
	a.queueStreamState(b, keys)
	// A batch of counters checked as such (the meter-kinds lock is then
	// held, queued above, so no meter is declared until this transaction
	// ends) sends its operation ids to be looked up in the other kinds'
	// readings only once a meter of another kind exists. Until the Ledger
	// has seen one, it reads whether one is now: when one is, the batch is
	// given back (errKindsDiffer) and applied again the general way, which
	// always looks the ids up.
	var declared bool
	if a.checkKind == Counter && !a.otherKinds.Load() {
		b.Queue(qOtherKindsDeclared).QueryRow(func(row pgx.Row) error { return row.Scan(&declared) })
	} else {
		a.queueOtherKinds(b, opIDs, Counter)
	}
	if a.lookupAll {
		a.queueOperations(b, opIDs)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("ledger: load: %w", err)
	}
	if declared {
		a.otherKinds.Store(true)
		return errKindsDiffer
	}
	if a.kindsDiffer() {
		return errKindsDiffer
	}
	for _, k := range keys {
		if a.streams[k] == nil {
			return fmt.Errorf("ledger: stream %+v was not created", k)
		}
	}

	if !a.lookupAll {
		if opIDs := a.recordable(valid); len(opIDs) > 0 {
			b = &pgx.Batch{}
			a.queueOperations(b, opIDs)
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return fmt.Errorf("ledger: load recorded operations: %w", err)
			}
		}
	}

	// Second round trip, only for records that could touch recorded seqs.
	// A record whose operation id is recorded is a duplicate or a conflict
	// by that alone (apply never looks at its seq), so a retransmit costs
	// no second read.
	var candStream, candSeq []int64
	for _, i := range valid {
		r := &a.recs[i]
		s := a.streamOf(r.Stream)
		if _, recorded := a.ops[r.OperationID]; recorded {
			continue
		}
		if r.Seq <= s.dbLastSeq {
			candStream = append(candStream, s.id)
			candSeq = append(candSeq, r.Seq)
		}
	}
	if len(candSeq) == 0 {
		return nil
	}
	b = &pgx.Batch{}
	a.queueRecordedSeqs(b, candStream, candSeq)
	a.queueOpenGaps(b, candStream, candSeq)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("ledger: load recorded seqs: %w", err)
	}
	return nil
}

// NUMERIC columns scan straight into decimals through the pgx adapter's
// types (conversions of decimal.Decimal, so no copy and no parse), whatever
// the pool's type map: the ledger does not depend on how its caller
// configured the connection.
func numericDst(d *decimal.Decimal) *pgxdecimal.Decimal { return (*pgxdecimal.Decimal)(d) }

func nullNumericDst(d *decimal.NullDecimal) *pgxdecimal.NullDecimal {
	return (*pgxdecimal.NullDecimal)(d)
}

// queueStreamState creates the batch's streams that do not exist yet and
// loads all of them, row-locked, into a.streams and a.byID.
func (a *applier) queueStreamState(b *pgx.Batch, keys []StreamKey) {
	producers, epochs, customers, meters := streamArrays(keys)
	b.Queue(qInsertStreams, producers, epochs, customers, meters)
	a.byID = make(map[int64]*stream, len(keys))
	// A stream's seqs of the batch go into a map of its own (seen, or a
	// gauge's known readings): sized for the stream's share of the batch,
	// it does not grow record by record.
	a.perStream = (len(a.recs) + len(keys) - 1) / max(len(keys), 1)
	b.Queue(qLockStreams, producers, epochs, customers, meters).Query(func(rows pgx.Rows) error {
		var s stream
		_, err := pgx.ForEachRow(rows, []any{&s.id, &s.key.Producer, &s.key.Epoch, &s.key.Customer, &s.key.Meter,
			&s.lastSeq, numericDst(&s.lastTotal)}, func() error {
			st := s
			st.dbLastSeq = st.lastSeq
			a.streams[st.key] = &st
			a.byID[st.id] = &st
			return nil
		})
		return err
	})
}

// queueOperations loads the records already stored under the batch's
// operation ids into a.ops, for duplicate detection.
func (a *applier) queueOperations(b *pgx.Batch, opIDs []uuid.UUID) {
	b.Queue(qRecordsByOperation, pguuid.Slice(opIDs)).Query(func(rows pgx.Rows) error {
		var op pgtype.UUID
		var s stored
		_, err := pgx.ForEachRow(rows, []any{&op, &s.streamID, &s.seq, numericDst(&s.total), nullNumericDst(&s.quantity),
			&s.occurredAt, &s.final}, func() error {
			a.loaded = append(a.loaded, s)
			a.ops[op.Bytes] = -int32(len(a.loaded))
			return nil
		})
		return err
	})
}

// queueRecordedSeqs loads which operation recorded each candidate seq.
func (a *applier) queueRecordedSeqs(b *pgx.Batch, streamIDs, seqs []int64) {
	b.Queue(qRecordsBySeq, streamIDs, seqs).Query(func(rows pgx.Rows) error {
		var sid, seq int64
		var op pgtype.UUID
		_, err := pgx.ForEachRow(rows, []any{&sid, &seq, &op}, func() error {
			a.see(a.byID[sid], seq, op.Bytes)
			return nil
		})
		return err
	})
}

// queueOpenGaps loads the open gaps containing the candidate seqs. A gap
// stored before migration 00009 has no unmoved amount: all of it is.
func (a *applier) queueOpenGaps(b *pgx.Batch, streamIDs, seqs []int64) {
	b.Queue(qGapsContaining, streamIDs, seqs).Query(func(rows pgx.Rows) error {
		var sid int64
		var g gap
		var unmoved decimal.NullDecimal
		var fillOp pgtype.UUID
		var fillSeq *int64
		var fillAt, fillPeriod, fillBucket *time.Time
		var fillClosed *bool
		_, err := pgx.ForEachRow(rows, []any{&sid, &g.from, &g.to, numericDst(&g.lower), numericDst(&g.upper),
			nullNumericDst(&g.upperQuantity), nullNumericDst(&unmoved), &g.billedPeriod, &g.billedBucket, &g.billedClosed,
			&fillOp, &fillSeq, &fillAt, &fillPeriod, &fillBucket, &fillClosed}, func() error {
			ng := g
			ng.fromDB = true
			ng.unmoved = unmoved.Decimal
			if !unmoved.Valid {
				ng.unmoved = gapAmount(ng.lower, ng.upper, ng.upperQuantity)
			}
			if fillSeq != nil {
				ng.upperFill = &fillPlace{op: fillOp.Bytes, seq: *fillSeq, occurredAt: fillAt.UTC(),
					period: fillPeriod.UTC(), bucket: fillBucket.UTC(), closed: *fillClosed}
			}
			s := a.byID[sid]
			s.gaps = append(s.gaps, &ng)
			return nil
		})
		return err
	})
}

// queueCustomers creates unknown customers with the default calendar, takes
// the shared customer locks (see doc.go), and loads their calendars and the
// closed periods that usage from minOccurred on could fall into.
func (a *applier) queueCustomers(b *pgx.Batch, customers []string, minOccurred time.Time) {
	periods.QueueCreateCustomers(b, customers)
	b.Queue(qLockCustomersShared, customers, periods.CustomerLockSpace, periods.CustomerLockBuckets)
	b.Queue(qSelectCustomers, customers).Query(func(rows pgx.Rows) error {
		var id string
		var raw []byte
		_, err := pgx.ForEachRow(rows, []any{&id, &raw}, func() error {
			var s periods.Schedule
			if err := json.Unmarshal(raw, &s); err != nil {
				return fmt.Errorf("customer %q: stored calendar: %w", id, err)
			}
			a.calendars[id] = s
			return nil
		})
		return err
	})
	// Closed periods that any record's own period could be. (Whether the
	// period that billed a gap is closed comes with the gap.)
	b.Queue(qSelectClosedPeriods, customers, minOccurred).Query(func(rows pgx.Rows) error {
		var c string
		var start time.Time
		_, err := pgx.ForEachRow(rows, []any{&c, &start}, func() error {
			a.closed[periodKey{c, start.UnixMicro()}] = true
			return nil
		})
		return err
	})
}

// loadCustomers is queueCustomers in a round trip of its own.
func (a *applier) loadCustomers(ctx context.Context, tx Tx, customers []string, minOccurred time.Time) error {
	b := &pgx.Batch{}
	a.queueCustomers(b, customers, minOccurred)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("ledger: load customers: %w", err)
	}
	return nil
}

// apply decides one record's outcome against the state built so far.
func (a *applier) apply(i int) error {
	r := &a.recs[i]
	s := a.streamOf(r.Stream)

	if detail, ok := a.reusedElsewhere(r, Counter); ok {
		a.conflict(i, s, ReasonOperationReused, &r.OperationID, detail)
		return nil
	}
	if prev, ok := a.op(r.OperationID); ok {
		if prev.streamID == s.id && prev.seq == r.Seq && prev.total.Equal(r.Total) &&
			nullEqual(prev.quantity, r.Quantity) && prev.occurredAt.Equal(r.OccurredAt) && prev.final == r.Final {
			a.out[i] = Outcome{Kind: Duplicate}
			return nil
		}
		a.conflict(i, s, ReasonOperationReused, &r.OperationID,
			fmt.Sprintf("operation_id %s was first recorded with other content (stream %d seq %d total %s); the first write stands",
				r.OperationID, prev.streamID, prev.seq, prev.total))
		return nil
	}

	if r.Seq <= s.lastSeq {
		if op, ok := s.seen[r.Seq]; ok || r.Seq == s.lastSeq {
			var existing *uuid.UUID
			if ok {
				existing = &op
			}
			a.conflict(i, s, ReasonSeqReused, existing,
				fmt.Sprintf("seq %d of this stream is already recorded under operation_id %s; the first write stands", r.Seq, op))
			return nil
		}
		return a.lateFill(i, s)
	}

	if r.Total.LessThan(s.lastTotal) {
		a.out[i] = Outcome{Kind: Rejected, Reason: ReasonTotalDecreased,
			Detail: fmt.Sprintf("total %s at seq %d is below %s at seq %d: a counter reset needs a new epoch",
				r.Total, r.Seq, s.lastTotal, s.lastSeq)}
		return nil
	}

	delta := deltaOf(r.Total, s.lastTotal, r.Quantity)
	p, bucket, prior, err := a.place(s, r.OccurredAt)
	if err != nil {
		return err
	}
	if r.Seq > s.lastSeq+1 {
		s.gaps = append(s.gaps, &gap{
			from: s.lastSeq + 1, to: r.Seq - 1,
			lower: s.lastTotal, upper: r.Total, upperQuantity: r.Quantity,
			unmoved:      gapAmount(s.lastTotal, r.Total, r.Quantity),
			billedPeriod: p, billedBucket: bucket, billedClosed: a.closed[periodKey{r.Stream.Customer, p.UnixMicro()}],
		})
		if r.Quantity.Valid && r.Quantity.Decimal.GreaterThan(delta) {
			a.find(FindingQuantityMismatch, s, r.Seq, &p, ptr(r.Quantity.Decimal.Sub(delta)),
				fmt.Sprintf("quantity %s at seq %d exceeds the %s the total grew by since seq %d; total wins",
					r.Quantity.Decimal, r.Seq, delta, s.lastSeq))
		}
	} else if r.Quantity.Valid && !r.Quantity.Decimal.Equal(delta) {
		a.find(FindingQuantityMismatch, s, r.Seq, &p, ptr(r.Quantity.Decimal.Sub(delta)),
			fmt.Sprintf("quantity %s at seq %d but total grew by %s; total wins", r.Quantity.Decimal, r.Seq, delta))
	}
	s.lastSeq, s.lastTotal, s.dirty = r.Seq, r.Total, true
	if r.Final {
		s.finalSeq = r.Seq
	}
	a.record(i, s, false, delta, p, bucket, prior)
	a.out[i] = Outcome{Kind: Applied, Billed: delta, Period: p}
	if prior != nil { // a closed period's: not in a run (see place)
		a.roll(r.Stream.Customer, r.Stream.Meter, p, bucket, delta)
	}
	return nil
}

// lateFill handles an unseen seq below the stream's last seq: it must lie
// in an open gap, whose usage was already billed.
func (a *applier) lateFill(i int, s *stream) error {
	r := &a.recs[i]
	var g *gap
	for _, c := range s.gaps {
		if !c.gone && c.from <= r.Seq && r.Seq <= c.to {
			g = c
			break
		}
	}
	if g == nil {
		return fmt.Errorf("ledger: stream %d: seq %d is below last seq %d, unrecorded, and in no open gap: stored state is inconsistent",
			s.id, r.Seq, s.lastSeq)
	}
	if r.Total.LessThan(g.lower) || r.Total.GreaterThan(g.upper) {
		a.conflict(i, s, ReasonOutOfBounds, nil,
			fmt.Sprintf("late fill seq %d has total %s, outside its neighbours' totals %s (seq %d) and %s (seq %d)",
				r.Seq, r.Total, g.lower, g.from-1, g.upper, g.to+1))
		return nil
	}

	own, err := a.periodOf(r.Stream.Customer, r.OccurredAt)
	if err != nil {
		return err
	}
	ownPeriod := own.Start.UTC()
	bucket, err := a.bucketOf(r.Stream.Customer, r.OccurredAt)
	if err != nil {
		return err
	}
	// Where this fill belongs: its quantity moves there (now, or once the
	// seqs below it tell it).
	place := &fillPlace{op: r.OperationID, seq: r.Seq, occurredAt: r.OccurredAt, period: ownPeriod, bucket: bucket,
		closed: a.closed[periodKey{r.Stream.Customer, ownPeriod.UnixMicro()}]}

	// What this record's own quantity is, as far as the neighbours tell.
	var q decimal.NullDecimal
	if r.Seq == g.from {
		q = decimal.NewNullDecimal(r.Total.Sub(g.lower))
		if r.Quantity.Valid && !r.Quantity.Decimal.Equal(q.Decimal) {
			a.find(FindingQuantityMismatch, s, r.Seq, &ownPeriod, ptr(r.Quantity.Decimal.Sub(q.Decimal)),
				fmt.Sprintf("quantity %s at seq %d but total grew by %s since seq %d; total wins", r.Quantity.Decimal, r.Seq, q.Decimal, r.Seq-1))
		}
	} else if r.Quantity.Valid && r.Quantity.Decimal.LessThanOrEqual(r.Total.Sub(g.lower)) {
		q = r.Quantity
	}
	if r.Seq == g.to && g.upperQuantity.Valid {
		if want := g.upper.Sub(g.upperQuantity.Decimal); !want.Equal(r.Total) {
			a.find(FindingQuantityMismatch, s, g.to+1, &g.billedPeriod, ptr(r.Total.Sub(want)),
				fmt.Sprintf("seq %d said quantity %s (so seq %d's total is %s) but seq %d arrived with total %s; totals win",
					g.to+1, g.upperQuantity.Decimal, r.Seq, want, r.Seq, r.Total))
		}
	}

	// Never more than the gap still holds in its billed period: when the
	// neighbours' quantities disagree with this fill's, totals win (the
	// fill's total lies within bounds) and the excess is a finding.
	if q.Valid && q.Decimal.GreaterThan(g.unmoved) {
		a.find(FindingQuantityMismatch, s, r.Seq, &ownPeriod, ptr(q.Decimal.Sub(g.unmoved)),
			fmt.Sprintf("late fill seq %d's quantity %s is more than the %s of gap %d..%d still billed in period %s (the quantities sent around it disagree with the totals); %s of it is re-attributed",
				r.Seq, q.Decimal, g.unmoved, g.from, g.to, g.billedPeriod.Format(time.RFC3339), g.unmoved))
		q = decimal.NewNullDecimal(g.unmoved)
	}

	// Split the gap around the fill. The sub-gaps share what the fill
	// leaves of the gap's unmoved amount, each at most what its own
	// neighbours imply.
	g.gone = true
	left := g.unmoved
	if q.Valid {
		left = left.Sub(q.Decimal)
	}
	if r.Seq > g.from {
		sub := &gap{from: g.from, to: r.Seq - 1, lower: g.lower, upper: r.Total,
			upperQuantity: r.Quantity, billedPeriod: g.billedPeriod, billedBucket: g.billedBucket, billedClosed: g.billedClosed}
		sub.unmoved = decimal.Min(gapAmount(sub.lower, sub.upper, sub.upperQuantity), left)
		left = left.Sub(sub.unmoved)
		if !r.Quantity.Valid { // this fill's own quantity is in sub until its last seq arrives
			sub.upperFill = place
		}
		s.gaps = append(s.gaps, sub)
	}
	if u := g.upperFill; u != nil && r.Seq == g.to && !g.upperQuantity.Valid {
		// The fill above this gap arrived without its own quantity: it is
		// what is left of the gap above this fill's total.
		a.moveFillQuantity(s, r, g, u, decimal.Min(g.upper.Sub(r.Total), left))
	}
	if r.Seq < g.to {
		sub := &gap{from: r.Seq + 1, to: g.to, lower: r.Total, upper: g.upper, upperQuantity: g.upperQuantity, upperFill: g.upperFill,
			billedPeriod: g.billedPeriod, billedBucket: g.billedBucket, billedClosed: g.billedClosed}
		sub.unmoved = decimal.Min(gapAmount(sub.lower, sub.upper, sub.upperQuantity), left)
		s.gaps = append(s.gaps, sub)
	}

	// Re-attribution: move the fill's quantity from the period that billed
	// the gap to the fill's own period, when both are still open.
	if !ownPeriod.Equal(g.billedPeriod) && q.Valid && q.Decimal.Sign() > 0 {
		if place.closed || g.billedClosed {
			a.find(FindingNotReattributed, s, r.Seq, &ownPeriod, &q.Decimal,
				fmt.Sprintf("late fill seq %d (%s, occurred in period %s) stays billed in period %s: one of them is closed",
					r.Seq, q.Decimal, own.Name, g.billedPeriod.Format(time.RFC3339)))
		} else {
			a.reattribute(s, g, place, q.Decimal)
		}
	} else if !q.Valid && !ownPeriod.Equal(g.billedPeriod) {
		a.find(FindingNotReattributed, s, r.Seq, &ownPeriod, nil,
			fmt.Sprintf("late fill seq %d occurred in period %s but its own quantity is unknown (no quantity, previous seq unseen); it stays billed in the gap's period until the seqs before it arrive",
				r.Seq, own.Name))
	}
	a.record(i, s, true, decimal.Zero, ownPeriod, bucket, nil)
	a.out[i] = Outcome{Kind: LateFill, Period: ownPeriod}
	return nil
}

// moveFillQuantity moves q, the own quantity of the late fill u above gap
// g that r's arrival tells, from the period that billed g to u's own, as
// a fill whose quantity was known moves its own (both periods open; else
// a finding says it stays).
func (a *applier) moveFillQuantity(s *stream, r *Record, g *gap, u *fillPlace, q decimal.Decimal) {
	if q.Sign() <= 0 || u.period.Equal(g.billedPeriod) {
		return
	}
	if u.closed || g.billedClosed {
		a.find(FindingNotReattributed, s, u.seq, &u.period, &q,
			fmt.Sprintf("late fill seq %d's own %s, known once seq %d arrived, stays billed in period %s: it or period %s is closed",
				u.seq, q, r.Seq, g.billedPeriod.Format(time.RFC3339), u.period.Format(time.RFC3339)))
		return
	}
	a.reattribute(s, g, u, q)
}

// reattribute moves q of gap g's usage from the period that billed it to
// late fill f's own, by a pair of entries under f's operation id.
func (a *applier) reattribute(s *stream, g *gap, f *fillPlace, q decimal.Decimal) {
	c, m := s.key.Customer, s.key.Meter
	sid, seq := s.id, f.seq
	a.entries = append(a.entries,
		entry{kind: "reattribution", operationID: f.op, customer: c, meter: m,
			amount: q.Neg(), period: g.billedPeriod, bucket: g.billedBucket, occurredAt: f.occurredAt, streamID: &sid, seq: &seq},
		entry{kind: "reattribution", operationID: f.op, customer: c, meter: m,
			amount: q, period: f.period, bucket: f.bucket, occurredAt: f.occurredAt, streamID: &sid, seq: &seq},
	)
	a.roll(c, m, g.billedPeriod, g.billedBucket, q.Neg())
	a.roll(c, m, f.period, f.bucket, q)
}

// gapAmount is what a gap between totals lower and upper holds, as far as
// its neighbours tell: upper minus lower, less the upper record's own
// quantity when it was sent; never negative.
func gapAmount(lower, upper decimal.Decimal, upperQuantity decimal.NullDecimal) decimal.Decimal {
	d := upper.Sub(lower)
	if upperQuantity.Valid {
		d = d.Sub(upperQuantity.Decimal)
	}
	return decimal.Max(d, decimal.Zero)
}

func (a *applier) record(i int, s *stream, late bool, billed decimal.Decimal, period, bucket time.Time, prior *time.Time) {
	r := &a.recs[i]
	a.newRecords = append(a.newRecords, newRecord{rec: r, streamID: s.id, lateFill: late,
		billed: billed, period: period, bucket: bucket, priorPeriod: prior})
	a.ops[r.OperationID] = int32(i)
	a.see(s, r.Seq, r.OperationID)
}

// op returns the operation recorded under id, in the store or earlier in
// the batch.
func (a *applier) op(id uuid.UUID) (stored, bool) {
	i, ok := a.ops[id]
	switch {
	case !ok:
		return stored{}, false
	case i < 0:
		return a.loaded[-1-i], true
	}
	r := &a.recs[i]
	return stored{streamID: a.streamOf(r.Stream).id, seq: r.Seq, total: r.Total, quantity: r.Quantity,
		occurredAt: r.OccurredAt, final: r.Final}, true
}

// see records that op holds seq of s, in the stream's map of seen seqs,
// made on its first seq at the stream's share of the batch (a gauge
// batch, which keeps its seqs with its readings, makes none).
func (a *applier) see(s *stream, seq int64, op uuid.UUID) {
	if s.seen == nil {
		s.seen = make(map[int64]uuid.UUID, a.perStream)
	}
	s.seen[seq] = op
}

func (a *applier) conflict(i int, s *stream, reason string, existing *uuid.UUID, detail string) {
	a.out[i] = Outcome{Kind: Conflict, Reason: reason, Detail: detail}
	a.conflicts = append(a.conflicts, conflictRow{reason: reason, rec: &a.recs[i], streamID: s.id, existingOp: existing})
}

func (a *applier) find(kind string, s *stream, seq int64, period *time.Time, amt *decimal.Decimal, detail string) {
	sid := s.id
	a.findings = append(a.findings, finding{kind: kind, customer: s.key.Customer, meter: s.key.Meter,
		streamID: &sid, seq: &seq, period: period, amount: amt, detail: detail})
}

func ptr[T any](v T) *T { return &v }

func (a *applier) roll(customer, meter string, period, bucket time.Time, q decimal.Decimal) {
	k := rollupKey{customer, meter, period.UnixMicro(), bucket.UnixMicro()}
	a.rollups[k] = a.rollups[k].Add(q)
}

// deltaOf is total − last, as Decimal.Sub gives it (the smaller exponent
// of the two). When the record's quantity is that same decimal, exponent
// included, it is the quantity itself: the common case, found by int64
// arithmetic on the coefficients, with no big.Int made for the delta.
func deltaOf(total, last decimal.Decimal, q decimal.NullDecimal) decimal.Decimal {
	if e := min(total.Exponent(), last.Exponent()); q.Valid && q.Decimal.Exponent() == e && q.Decimal.NumDigits() <= maxInt64Digits {
		t, tok := coefficientAt(total, e)
		l, lok := coefficientAt(last, e)
		if tok && lok && t-l == q.Decimal.CoefficientInt64() {
			return q.Decimal
		}
	}
	return total.Sub(last)
}

// maxInt64Digits: coefficients of at most this many digits, and their
// differences, fit in an int64.
const maxInt64Digits = 17

// coefficientAt is d's coefficient at exponent e (at most d's own), when
// it has at most maxInt64Digits digits there.
func coefficientAt(d decimal.Decimal, e int32) (int64, bool) {
	k := int(d.Exponent() - e)
	if k < 0 || d.NumDigits()+k > maxInt64Digits {
		return 0, false
	}
	c := d.CoefficientInt64()
	for range k {
		c *= 10
	}
	return c, true
}

// streamOf is a.streams[k] once the streams are loaded, remembering the
// last one found: a batch's records come mostly in runs of one stream (a
// message is one customer's), and comparing keys whose strings the decoder
// shares is cheaper than hashing them.
func (a *applier) streamOf(k StreamKey) *stream {
	if s := a.lastStream; s != nil && s.key == k {
		return s
	}
	s := a.streams[k]
	a.lastStream = s
	return s
}

// place is billingPlace for an in-order record of s that occurred at t,
// through the stream's run: within the run's span it answers from the run;
// otherwise it ends the run and, for a period that is not closed, begins a
// new one over the span in which the answer cannot change. A record placed
// with prior nil is in the run, which bills it when it ends.
func (a *applier) place(s *stream, t time.Time) (period, bucket time.Time, prior *time.Time, err error) {
	if s.run.covers(t) {
		return s.run.period, s.run.bucket, nil, nil
	}
	a.endRun(s)
	period, bucket, prior, err = a.billingPlace(s.key.Customer, t)
	if err != nil || prior != nil {
		return period, bucket, prior, err
	}
	from, to, err := a.sameBucket(s.key.Customer, t, bucket)
	if err != nil {
		return period, bucket, prior, err
	}
	s.run = billingRun{from: from, to: to, period: period, bucket: bucket, base: s.lastTotal, set: true}
	return period, bucket, nil, nil
}

// endRun adds what the run's records billed to its hourly rollup and
// clears it.
func (a *applier) endRun(s *stream) {
	if s.run.set {
		a.roll(s.key.Customer, s.key.Meter, s.run.period, s.run.bucket, s.lastTotal.Sub(s.run.base))
	}
	s.run = billingRun{}
}

// endRuns ends every stream's run, before the rollups are written.
func (a *applier) endRuns() {
	for _, s := range a.streams {
		a.endRun(s)
	}
}

// sameBucket is the span around t, at the customer's period and bucket for
// t (not closed), in which billingPlace gives that same answer: within the
// period (a calendar changes only at a period boundary), the zone offset
// in force at t and the hour of the bucket.
func (a *applier) sameBucket(customer string, t, bucket time.Time) (from, to time.Time, err error) {
	p, err := a.periodOf(customer, t)
	if err != nil {
		return from, to, err
	}
	loc, err := a.calendars[customer].CalendarAt(t).Location()
	if err != nil {
		return from, to, err
	}
	zoneStart, zoneEnd := t.In(loc).ZoneBounds() // zero where the zone's offset never changes
	from, to = p.Start, p.End
	for _, f := range []time.Time{bucket, zoneStart} {
		if f.After(from) {
			from = f
		}
	}
	for _, e := range []time.Time{bucket.Add(time.Hour), zoneEnd} {
		if !e.IsZero() && e.Before(to) {
			to = e
		}
	}
	if t.Before(from) || !t.Before(to) {
		// A span that does not hold t (ZoneBounds may end a span early,
		// golang/go#81583): no run; the next record is looked up again.
		return t, t, nil
	}
	return from.UTC(), to.UTC(), nil
}

// periodOf is the customer's accounting period containing t. A batch's
// records mostly fall in one period per customer, and a schedule's periods
// tile time, so the last period found answers any t it contains.
func (a *applier) periodOf(customer string, t time.Time) (periods.Period, error) {
	if p, ok := a.lastPeriod[customer]; ok && p.Contains(t) {
		return p, nil
	}
	p, err := a.calendars[customer].PeriodAt(t)
	if err != nil {
		return p, fmt.Errorf("ledger: customer %q: period at %s: %w", customer, t, err)
	}
	if a.lastPeriod == nil {
		a.lastPeriod = map[string]periods.Period{}
	}
	a.lastPeriod[customer] = p
	return p, nil
}

// billingPlace is where usage that occurred at t is billed: its own
// period and hour, or, when that period is closed, the first later period
// of the customer that is still not closed, as a prior-period adjustment
// referencing its own period. Usage is never booked into a closed period,
// whatever the clocks say: the closed periods were read after the customer
// locks were taken (a close holds them exclusively), and the ledger's clock,
// read before the locks and possibly behind a closer's, only picks the hour
// within the chosen period.
func (a *applier) billingPlace(customer string, t time.Time) (period, bucket time.Time, prior *time.Time, err error) {
	p, err := a.periodOf(customer, t)
	if err != nil {
		return
	}
	start := p.Start.UTC()
	if !a.closed[periodKey{customer, start.UnixMicro()}] {
		bucket, err = a.bucketOf(customer, t)
		return start, bucket, nil, err
	}
	own := start // returned by address: only a closed period's record allocates it
	// Closes are few (one per period), so this walk is short.
	for a.closed[periodKey{customer, p.Start.UTC().UnixMicro()}] {
		next, err := a.calendars[customer].Next(p)
		if err != nil {
			return period, bucket, nil, fmt.Errorf("ledger: customer %q: period after %s: %w", customer, p.Name, err)
		}
		p = next
	}
	// The hour of now when now lies in that period; else its first hour
	// (a clock behind the close) or its last (a period awaiting its close).
	at := a.now
	if at.Before(p.Start) {
		at = p.Start
	} else if !at.Before(p.End) {
		at = p.End.Add(-time.Microsecond)
	}
	bucket, err = a.bucketOf(customer, at)
	return p.Start.UTC(), bucket, &own, err
}

// bucketOf is the start of the hour containing t in the customer's zone
// (which differs from the UTC hour in zones with half-hour offsets).
func (a *applier) bucketOf(customer string, t time.Time) (time.Time, error) {
	return Bucket(a.calendars[customer], t)
}

// Bucket is the rollup hour containing t: the start of its local hour in
// the zone of the calendar in force at t.
func Bucket(s periods.Schedule, t time.Time) (time.Time, error) {
	loc, err := s.CalendarAt(t).Location()
	if err != nil {
		return time.Time{}, err
	}
	_, off := t.In(loc).Zone()
	d := time.Duration(off) * time.Second
	return t.Add(d).Truncate(time.Hour).Add(-d).UTC(), nil
}

// Day is the daily rollup an amount in rollup bucket of the period
// starting at periodStart also goes to: the bucket's local date in the
// zone of the calendar in force at the period's start (one period has one
// zone), as midnight UTC of that date.
func Day(s periods.Schedule, periodStart, bucket time.Time) (time.Time, error) {
	loc, err := s.CalendarAt(periodStart).Location()
	if err != nil {
		return time.Time{}, err
	}
	y, m, d := bucket.In(loc).Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC), nil
}

func nullEqual(a, b decimal.NullDecimal) bool {
	if a.Valid != b.Valid {
		return false
	}
	return !a.Valid || a.Decimal.Equal(b.Decimal)
}

func streamArrays(keys []StreamKey) (producers []string, epochs []int64, customers, meters []string) {
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.Producer != b.Producer {
			return a.Producer < b.Producer
		}
		if a.Customer != b.Customer {
			return a.Customer < b.Customer
		}
		if a.Meter != b.Meter {
			return a.Meter < b.Meter
		}
		return a.Epoch < b.Epoch
	})
	for _, k := range keys {
		producers = append(producers, k.Producer)
		epochs = append(epochs, k.Epoch)
		customers = append(customers, k.Customer)
		meters = append(meters, k.Meter)
	}
	return
}

// ConflictHash is the payload_hash a conflict of r is kept under in the
// conflicts table, with its operation id and seq: where r is a record
// the ledger answered as a conflict (and so never applied), a row of
// conflicts has that hash. Reconciliation's deep check leaves such
// records out of what it recomputes from Kafka.
func ConflictHash(r Record) []byte {
	r.OccurredAt = r.OccurredAt.UTC().Truncate(time.Microsecond) // as Apply keeps it (normalised)
	_, h := conflictPayload(&r)
	return h
}

// conflictPayload is the losing record, kept verbatim in the conflicts table.
func conflictPayload(r *Record) ([]byte, []byte) {
	p := map[string]any{
		"operation_id": r.OperationID, "producer": r.Stream.Producer, "epoch": r.Stream.Epoch,
		"customer": r.Stream.Customer, "meter": r.Stream.Meter, "seq": r.Seq,
		"total": r.Total.String(), "occurred_at": r.OccurredAt.Format(time.RFC3339Nano), "final": r.Final,
	}
	if r.Quantity.Valid {
		p["quantity"] = r.Quantity.Decimal.String()
	}
	switch r.Shape { // gauge and unique records (kinds.go) carry no total
	case Gauge:
		delete(p, "total")
		p["level"] = r.Level.String()
	case Unique:
		delete(p, "total")
		p["member"] = r.Member
	}
	b, _ := json.Marshal(p) // map keys are sorted: the same record hashes the same
	h := sha256.Sum256(b)
	return b, h[:]
}

// recordable returns the operation ids of the records valid (indexes into
// a.recs) that may be recorded already: those at or below their stream's
// last seq as loaded (a seq above it cannot be), every one with
// lookupAll.
func (a *applier) recordable(valid []int) []uuid.UUID {
	var ids []uuid.UUID
	for _, i := range valid {
		if r, s := &a.recs[i], a.streamOf(a.recs[i].Stream); a.lookupAll || s != nil && r.Seq <= s.dbLastSeq {
			ids = append(ids, r.OperationID)
		}
	}
	return ids
}
