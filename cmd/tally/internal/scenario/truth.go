package scenario

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ingest/wire"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
)

// Expect is the ground truth of a run, written as JSON by `tally produce
// --expect` and read by `tally verify`.
type Expect struct {
	Run         string    `json:"run"`
	Topic       string    `json:"topic"`
	GeneratedAt time.Time `json:"generated_at"`
	// Customers are all customers of the run (verify looks only at them).
	Customers []string `json:"customers"`
	// Totals is what must be billed per customer, meter and period (the
	// customer's default calendar: monthly, UTC).
	Totals []Total `json:"totals"`
	// Gauges is every gauge's max, latest and unit_seconds per customer
	// and period, from the first reading's period through the last's.
	Gauges []GaugeTotal `json:"gauges,omitempty"`
	// Uniques is every unique meter's distinct members per customer and
	// period with readings.
	Uniques []UniqueTotal `json:"uniques,omitempty"`
	// Streams is the state every stream must end in, with its open gaps
	// (a gauge or unique stream: its last seq and final flag, no gaps).
	Streams []Stream `json:"streams"`
	// DeadLetters is how many dead letters each message key must have.
	DeadLetters map[string]int `json:"dead_letters"`
	// Acknowledged is the generator's own sum of usage the producers
	// acknowledged, per customer and meter (before faults).
	Acknowledged []Total `json:"acknowledged"`
	Stats        Stats   `json:"stats"`
}

// Check refuses a ground truth verify could only find "clean": one with no
// run id (not written by produce --expect), no customers (verify reads
// only the run's customers) or nothing to compare with the ledger.
func (e *Expect) Check() error {
	switch {
	case e.Run == "":
		return errors.New("no run id: not a ground truth written by tally produce --expect")
	case len(e.Customers) == 0:
		return errors.New("no customers: not a ground truth written by tally produce --expect")
	case len(e.Totals)+len(e.Gauges)+len(e.Uniques)+len(e.Streams) == 0:
		return fmt.Errorf("run %s: nothing to check (no totals, gauges, unique meters or streams: produce acknowledged no records)", e.Run)
	}
	return nil
}

// Total is a quantity for a customer and meter, in a period when Period is
// set.
type Total struct {
	Customer    string          `json:"customer"`
	Meter       string          `json:"meter"`
	Period      string          `json:"period,omitempty"`
	PeriodStart *time.Time      `json:"period_start,omitempty"`
	Quantity    decimal.Decimal `json:"quantity"`
}

// Stream is a stream's expected final state.
type Stream struct {
	Producer  string          `json:"producer"`
	Epoch     int64           `json:"epoch"`
	Customer  string          `json:"customer"`
	Meter     string          `json:"meter"`
	LastSeq   int64           `json:"last_seq"`
	LastTotal decimal.Decimal `json:"last_total"`
	Final     bool            `json:"final"`
	Gaps      []Gap           `json:"gaps,omitempty"`
}

// Gap is a run of seqs that never reached Kafka; their usage is billed
// inside the total of the record after them.
type Gap struct {
	From     int64           `json:"from_seq"`
	To       int64           `json:"to_seq"`
	Quantity decimal.Decimal `json:"quantity"`
}

// Stats counts what a run did.
type Stats struct {
	Producers        int     `json:"producers"`
	Records          int64   `json:"records_acknowledged"`
	Seconds          float64 `json:"seconds"`
	RecordsPerSecond float64 `json:"records_per_second"`
	Messages         int64   `json:"messages_written"`
	Duplicates       int64   `json:"duplicates"`
	Retransmits      int64   `json:"retransmits"`
	Lost             int64   `json:"lost_batches"`
	// LostReadings is how many gauge and unique readings never reached
	// Kafka (inside lost batches).
	LostReadings int64 `json:"lost_readings"`
	Reordered    int64 `json:"reordered"`
	Crashes      int   `json:"crashes"`
	Epochs       int   `json:"epochs"`
	BadMessages  int   `json:"bad_messages"`
}

type sKey struct {
	producer string
	epoch    int64
	customer string
	meter    string
}

type seen struct {
	total, quantity decimal.Decimal
	level           decimal.NullDecimal // a gauge reading's
	member          string              // a unique reading's
	at              time.Time
	final           bool
	delivered       bool
}

// held is a message the fault writer acknowledged without writing.
type held struct {
	msg     kafka.Message
	streams map[sKey][]int64 // stream → its seqs in the message
	lost    bool             // true: lost unless never superseded; false: delayed (reordered)
}

// tracker is the fault-injecting MessageWriter shared by a run's
// producers, and the observer of everything they sent.
type tracker struct {
	w      *kafka.Writer
	faults Faults

	mu      sync.Mutex
	rng     *rand.Rand
	streams map[sKey]map[int64]*seen
	maxDel  map[sKey]int64   // highest delivered seq
	epoch   map[string]int64 // producer → its newest epoch
	holds   []*held
	stats   Stats
	broken  error // a write whose outcome is unknown
	did     struct{ lost, reorder, duplicate, retransmit bool }
}

// inject reports whether a fault of probability p happens at this chance
// (hit: the dice said so). A fault with p > 0 always happens at its first
// chance, so a short or CPU-starved run that writes only a few dozen
// messages still shows every fault it was asked for.
func (t *tracker) inject(done *bool, p float64, hit bool) bool {
	if p <= 0 || (*done && !hit) {
		return false
	}
	*done = true
	return true
}

func newTracker(w *kafka.Writer, f Faults, seed uint64) *tracker {
	return &tracker{w: w, faults: f, rng: rand.New(rand.NewPCG(seed, 7)),
		streams: map[sKey]map[int64]*seen{}, maxDel: map[sKey]int64{}, epoch: map[string]int64{}}
}

// WriteMessages implements producer.MessageWriter with faults.
func (t *tracker) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	t.mu.Lock()
	// Until a loss holds that is or can still become a gap, every chance
	// loses a message: a resend can undo a loss, a crash can end its
	// streams, and a run must still have a lost batch.
	t.holds = slices.DeleteFunc(t.holds, func(h *held) bool { return h.lost && t.undone(h) })
	t.did.lost = slices.ContainsFunc(t.holds, func(h *held) bool { return h.lost && (t.superseded(h) || t.alive(h)) })
	var out []kafka.Message
	var outStreams []map[sKey][]int64
	lost := false // a message of this call is lost: the call is acknowledged
	for _, m := range msgs {
		b, _, rej, err := wire.Decode(m.Key, m.Value)
		if err != nil || len(rej) > 0 {
			t.mu.Unlock()
			return fmt.Errorf("scenario: the producer sent a message ingest would refuse: %v %v", err, rej)
		}
		streams := t.observe(b)
		hasFinal := slices.ContainsFunc(b.Records, func(r wire.Record) bool { return r.Final })
		switch x := t.rng.Float64(); {
		case !hasFinal && t.inject(&t.did.lost, t.faults.Lost, x < t.faults.Lost):
			t.holds = append(t.holds, &held{msg: m, streams: streams, lost: true})
			lost = true
		case t.inject(&t.did.reorder, t.faults.Reorder, x < t.faults.Lost+t.faults.Reorder):
			t.holds = append(t.holds, &held{msg: m, streams: streams})
			t.stats.Reordered++
		default:
			out = append(out, m)
			outStreams = append(outStreams, streams)
			if t.inject(&t.did.duplicate, t.faults.Duplicates, t.rng.Float64() < t.faults.Duplicates) {
				out = append(out, m)
				outStreams = append(outStreams, streams)
				t.stats.Duplicates++
			}
		}
	}
	// Delayed messages held by an earlier call go after this call's.
	rest := t.holds[:0:0]
	for _, h := range t.holds {
		if !h.lost && !slices.ContainsFunc(msgs, func(m kafka.Message) bool { return string(m.Value) == string(h.msg.Value) }) {
			out = append(out, h.msg)
			outStreams = append(outStreams, h.streams)
		} else {
			rest = append(rest, h)
		}
	}
	t.holds = rest
	retransmit := len(out) > 0 && !lost && t.inject(&t.did.retransmit, t.faults.Retransmits, t.rng.Float64() < t.faults.Retransmits)
	t.mu.Unlock()

	if err := t.write(ctx, out, outStreams); err != nil {
		return err
	}
	if retransmit {
		t.mu.Lock()
		t.stats.Retransmits++
		t.mu.Unlock()
		return errors.New("scenario: injected fault: the acknowledgement was lost (the batch was written; the producer resends it)")
	}
	return nil
}

// write writes out and marks it delivered. The ground truth must know
// exactly what reached Kafka, and a write that failed may have reached it
// all the same (a cancelled context, a timeout): so once the fault writer
// decided to deliver messages, it retries until they are surely written,
// whatever the producer's context says, and only then returns the
// context's error to the producer (which resends: duplicates).
func (t *tracker) write(ctx context.Context, out []kafka.Message, streams []map[sKey][]int64) error {
	if len(out) == 0 {
		return ctx.Err()
	}
	var err error
	for attempt := range 50 {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		err = t.w.WriteMessages(wctx, out...)
		cancel()
		if err == nil {
			break
		}
		if attempt == 49 {
			t.mu.Lock()
			t.broken = fmt.Errorf("scenario: cannot write to Kafka, the ground truth is unknown: %w", err)
			t.mu.Unlock()
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.mu.Lock()
	t.stats.Messages += int64(len(out))
	for _, s := range streams {
		t.delivered(s)
	}
	t.mu.Unlock()
	return ctx.Err()
}

// observe records b's records; it returns each stream's seqs in b.
func (t *tracker) observe(b wire.Batch) map[sKey][]int64 {
	out := map[sKey][]int64{}
	for _, r := range b.Records {
		k := sKey{b.Producer, b.Epoch, r.Customer, r.Meter}
		t.epoch[b.Producer] = max(t.epoch[b.Producer], b.Epoch)
		m := t.streams[k]
		if m == nil {
			m = map[int64]*seen{}
			t.streams[k] = m
		}
		if m[r.Seq] == nil {
			m[r.Seq] = &seen{total: r.Total, quantity: r.Quantity.Decimal, level: r.Level, member: r.Member, at: r.OccurredAt, final: r.Final}
		}
		out[k] = append(out[k], r.Seq)
	}
	return out
}

// superseded reports whether a later record of each of h's streams was
// delivered: h's loss is in the middle of its streams.
func (t *tracker) superseded(h *held) bool {
	for k, seqs := range h.streams {
		if t.maxDel[k] <= slices.Max(seqs) {
			return false
		}
	}
	return true
}

// alive reports whether h's streams can still go on: its producer has not
// moved to a new epoch.
func (t *tracker) alive(h *held) bool {
	for k := range h.streams {
		if k.epoch < t.epoch[k.producer] {
			return false
		}
	}
	return true
}

// undone reports whether every record of a lost message reached Kafka
// anyway, resent after a reported failure or a crash: it is no loss.
func (t *tracker) undone(h *held) bool {
	for k, seqs := range h.streams {
		for _, s := range seqs {
			if !t.streams[k][s].delivered {
				return false
			}
		}
	}
	return true
}

// delivered marks the records of a written message.
func (t *tracker) delivered(streams map[sKey][]int64) {
	for k, seqs := range streams {
		m := t.streams[k]
		for _, s := range seqs {
			m[s].delivered = true
			t.maxDel[k] = max(t.maxDel[k], s)
		}
	}
}

// drain writes every held message whose loss would not be in the middle
// of its streams (no later record of one of them was delivered), and
// counts the others as lost. Called once all producers are closed.
func (t *tracker) drain(ctx context.Context) error {
	t.mu.Lock()
	var out []kafka.Message
	var outStreams []map[sKey][]int64
	for _, h := range t.holds {
		if h.lost && t.undone(h) {
			continue
		}
		if h.lost && t.superseded(h) {
			t.stats.Lost++
			continue
		}
		out = append(out, h.msg)
		outStreams = append(outStreams, h.streams)
	}
	t.holds = nil
	t.mu.Unlock()
	if err := t.write(ctx, out, outStreams); err != nil {
		return fmt.Errorf("scenario: write held messages: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.broken
}

// truth computes the expected ledger from the records the producers sent
// and the order in which they reached Kafka (delivered, from readBack).
func (t *tracker) truth(e *Expect, delivered map[sKey][]int64) (unbilled map[[2]string]decimal.Decimal, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cal := periods.DefaultCalendar()
	type tk struct {
		customer, meter string
		start           int64
	}
	totals := map[tk]*Total{}
	unbilled = map[[2]string]decimal.Decimal{}
	gauges := map[[2]string][]ledger.GaugeReading{}
	uniques := map[[2]string][]uniqueSeen{}
	keys := make([]sKey, 0, len(t.streams))
	for k := range t.streams {
		keys = append(keys, k)
	}
	for k := range delivered {
		if t.streams[k] == nil {
			return nil, fmt.Errorf("scenario: Kafka holds records of stream %v that no producer of the run sent", k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.producer != b.producer {
			return a.producer < b.producer
		}
		if a.epoch != b.epoch {
			return a.epoch < b.epoch
		}
		if a.customer != b.customer {
			return a.customer < b.customer
		}
		return a.meter < b.meter
	})
	for _, k := range keys {
		recs := t.streams[k]
		maxSeq := int64(0)
		for s := range recs {
			maxSeq = max(maxSeq, s)
		}
		for s := int64(1); s <= maxSeq; s++ {
			if recs[s] == nil {
				return nil, fmt.Errorf("scenario: stream %v: seq %d was never sent though seq %d was", k, s, maxSeq)
			}
		}
		// Replay the delivery order: a record past the last seq reveals
		// the seqs before it as a gap, billed in its own period; a late
		// fill moves only its own quantity to its period (docs/design.md §3).
		got := map[int64]bool{}
		billedAt := map[int64]time.Time{}
		last := int64(0)
		for _, s := range delivered[k] {
			if got[s] {
				continue
			}
			if recs[s] == nil {
				return nil, fmt.Errorf("scenario: stream %v: Kafka holds seq %d that no producer sent", k, s)
			}
			got[s] = true
			if s > last {
				for x := last + 1; x < s; x++ {
					billedAt[x] = recs[s].at
				}
				last = s
			}
		}
		st := Stream{Producer: k.producer, Epoch: k.epoch, Customer: k.customer, Meter: k.meter}
		if r := recs[1]; r != nil && (r.level.Valid || r.member != "") {
			// A gauge or unique stream: what reached Kafka is what counts;
			// the ledger keeps no gaps of it (docs/design.md §16).
			for s := int64(1); s <= maxSeq; s++ {
				r := recs[s]
				if !got[s] {
					t.stats.LostReadings++
					continue
				}
				if s == last {
					st.LastSeq, st.LastTotal, st.Final = s, r.total, r.final
				}
				k2 := [2]string{k.customer, k.meter}
				if r.level.Valid {
					gauges[k2] = append(gauges[k2], ledger.GaugeReading{Producer: k.producer, Epoch: k.epoch, Seq: s,
						Level: r.level.Decimal, OccurredAt: r.at, Final: r.final})
				} else {
					uniques[k2] = append(uniques[k2], uniqueSeen{r.member, r.at})
				}
			}
			if st.LastSeq > 0 {
				e.Streams = append(e.Streams, st)
			}
			continue
		}
		prev := decimal.Zero
		var gap *Gap
		for s := int64(1); s <= maxSeq; s++ {
			r := recs[s]
			usage := r.total.Sub(prev)
			prev = r.total
			at := r.at
			if got[s] {
				if s == last {
					st.LastSeq, st.LastTotal, st.Final = s, r.total, r.final
				}
				if gap != nil {
					st.Gaps = append(st.Gaps, *gap)
					gap = nil
				}
			} else {
				b, ok := billedAt[s]
				if !ok {
					k2 := [2]string{k.customer, k.meter}
					unbilled[k2] = unbilled[k2].Add(usage)
					continue
				}
				at = b
				if gap == nil {
					gap = &Gap{From: s, To: s}
				}
				gap.To = s
				gap.Quantity = gap.Quantity.Add(usage)
			}
			p, err := cal.PeriodAt(at)
			if err != nil {
				return nil, err
			}
			key := tk{k.customer, k.meter, p.Start.Unix()}
			tot := totals[key]
			if tot == nil {
				start := p.Start.UTC()
				tot = &Total{Customer: k.customer, Meter: k.meter, Period: p.Name, PeriodStart: &start}
				totals[key] = tot
			}
			tot.Quantity = tot.Quantity.Add(usage)
		}
		if st.LastSeq > 0 {
			e.Streams = append(e.Streams, st)
		}
	}
	for _, tot := range totals {
		e.Totals = append(e.Totals, *tot)
	}
	if err := kindsTruth(e, gauges, uniques); err != nil {
		return nil, err
	}
	sort.Slice(e.Totals, func(i, j int) bool {
		a, b := e.Totals[i], e.Totals[j]
		if a.Customer != b.Customer {
			return a.Customer < b.Customer
		}
		if a.Meter != b.Meter {
			return a.Meter < b.Meter
		}
		return a.PeriodStart.Before(*b.PeriodStart)
	})
	return unbilled, nil
}
