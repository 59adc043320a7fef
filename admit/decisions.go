package admit

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tally-ledger/tally/internal/pause"
	"github.com/tally-ledger/tally/quota"
)

// What a budget's rule is, as far as the client knows. Grants are asked
// for until Tally says the rule is not exact.
const (
	kindUnknown uint32 = iota
	kindExact
	kindLagged // answered from the latest decision
	kindNoRule // no quota rule: admitted
)

// lagged is what Admit needs of a decision, computed once when it is read
// so that the hot path compares two integers.
type lagged struct {
	staleAt int64 // unix nanos: as_of + stale_after; MinInt64 when as_of is unknown
	onStale Policy
	enforce bool
	over    bool // state exceeded
	d       quota.Decision
}

func newLagged(d quota.Decision) *lagged {
	l := &lagged{staleAt: math.MinInt64, onStale: Allow, enforce: d.Mode == quota.Enforce,
		over: d.State == quota.Exceeded, d: d}
	if d.OnStale == quota.Deny {
		l.onStale = Deny
	}
	switch {
	case d.State == quota.NoLimit:
		// The rule has no lagged period limit: admitted, and never stale
		// (Decision.Stale).
		l.staleAt = math.MaxInt64
	case d.AsOf != nil:
		l.staleAt = d.AsOf.Add(time.Duration(d.StaleAfter)).UnixNano()
	}
	return l
}

// fromDecision answers a request under a lagged rule (or none) from memory:
// the same answer as quota.Decision.Blocks, without a lock or allocation.
func (c *Client) fromDecision(b *budget) Decision {
	if b.kind.Load() == kindNoRule {
		return Decision{Admitted: true, How: NoRule}
	}
	l := b.dec.Load()
	if l == nil {
		// No decision read yet (just started, or Kafka unreachable since).
		return Decision{Admitted: c.cfg.OnStale == Allow, How: FromDecision, Binding: b.binding, Stale: true}
	}
	d := Decision{Admitted: true, How: FromDecision, Binding: b.binding}
	switch {
	case time.Now().UnixNano() > l.staleAt:
		d.Stale = true
		// A shadow rule never blocks, stale or not.
		d.Admitted = !l.enforce || l.onStale == Allow
	case l.over && l.enforce:
		d.Admitted = false
	case l.over:
		d.Shadow = true
	}
	return d
}

// Latest returns the latest decision read from Kafka for customer and
// meter, whatever the rule's admission.
func (c *Client) Latest(customer, meter string) (quota.Decision, bool) {
	c.decMu.Lock()
	defer c.decMu.Unlock()
	l := c.decisions[key{customer, meter}]
	if l == nil {
		return quota.Decision{}, false
	}
	return l.d, true
}

// onDecision keeps d if it is newer than the one held for its key. Under
// decMu, so a budget added meanwhile either sees it or is seen.
func (c *Client) onDecision(d quota.Decision) {
	k := key{d.Customer, d.Meter}
	c.decMu.Lock()
	defer c.decMu.Unlock()
	if old := c.decisions[k]; old != nil && !d.Newer(old.d) {
		return // a deposed leader's late write, or a replay
	}
	l := newLagged(d)
	c.decisions[k] = l
	if b := c.budgets.load(k); b != nil {
		b.dec.Store(l)
	}
}

// readDecisions follows every partition of the decisions topic, from
// DecisionHistory ago (every key is republished at least every 30 s), until
// ctx ends. Partitions added later are not followed until the next New.
func (c *Client) readDecisions(ctx context.Context, wg *sync.WaitGroup) {
	defer wg.Done()
	var parts []kafka.Partition
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		var err error
		parts, err = c.partitions(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		c.decisionsFailed(listing, err)
		if !pause.For(ctx, wait) {
			return
		}
	}
	c.decisionsRead(listing)
	for _, p := range parts {
		wg.Add(1)
		go c.readPartition(ctx, wg, p.ID)
	}
}

func (c *Client) partitions(ctx context.Context) ([]kafka.Partition, error) {
	var err error
	for _, b := range c.cfg.Brokers {
		var conn *kafka.Conn
		conn, err = c.cfg.Dialer.DialContext(ctx, "tcp", b)
		if err != nil {
			continue
		}
		var parts []kafka.Partition
		parts, err = conn.ReadPartitions(c.cfg.DecisionsTopic)
		conn.Close()
		if err == nil && len(parts) == 0 {
			err = errors.New("no partitions")
		}
		if err == nil {
			return parts, nil
		}
	}
	return nil, err
}

func (c *Client) readPartition(ctx context.Context, wg *sync.WaitGroup, partition int) {
	defer wg.Done()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: c.cfg.Brokers, Topic: c.cfg.DecisionsTopic, Partition: partition,
		Dialer: c.cfg.Dialer, MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 250 * time.Millisecond})
	defer r.Close()
	for {
		err := r.SetOffsetAt(ctx, time.Now().Add(-c.cfg.DecisionHistory))
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		c.decisionsFailed(partition, err)
		if !pause.For(ctx, time.Second) {
			return
		}
	}
	c.decisionsRead(partition)
	failing := false
	for {
		rctx, cancel := ctx, context.CancelFunc(func() {})
		if failing {
			// An idle topic brings no message to say Kafka answers again:
			// a second without an error in which the reader fetched does.
			// An error queued before Kafka came back is read within that
			// second, so it does not end the outage only to start another.
			rctx, cancel = context.WithTimeout(ctx, time.Second)
		}
		m, err := r.ReadMessage(rctx)
		cancel()
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return
			case failing && rctx.Err() != nil:
				if r.Stats().Fetches > 0 {
					failing = false
					c.decisionsRead(partition)
				}
			default:
				// The reader retries on its own, with backoff; the
				// outage is logged once for every partition.
				failing = true
				c.decisionsFailed(partition, err)
				r.Stats() // its counters start again from this error
			}
			continue
		}
		if failing {
			failing = false
			c.decisionsRead(partition)
		}
		var d quota.Decision
		if err := json.Unmarshal(m.Value, &d); err != nil || d.Customer == "" || d.Meter == "" {
			c.log.Warn("admit: not a decision; skipped", "partition", partition, "offset", m.Offset, "err", err)
			continue
		}
		c.onDecision(d)
	}
}

// listing stands for the listing of the topic's partitions in kafkaReach.
const listing = -1

// kafkaReach is whether the decision readers can read Kafka. An outage is
// logged once, when the first reader fails, and once more when every
// reader that failed reads again: each reader retries every second or so,
// and a line per partition and retry said nothing new.
type kafkaReach struct {
	mu        sync.Mutex
	failing   map[int]bool // partitions whose reader failed last (listing: the listing)
	downSince time.Time    // zero while Kafka is read
}

// decisionsFailed notes that partition (or listing) could not be read.
func (c *Client) decisionsFailed(partition int, err error) {
	r := &c.kafka
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing == nil {
		r.failing = map[int]bool{}
	}
	r.failing[partition] = true
	if r.downSince.IsZero() {
		r.downSince = time.Now()
		args := []any{"topic", c.cfg.DecisionsTopic, "brokers", c.cfg.Brokers, "err", err}
		if partition != listing {
			args = append(args, "partition", partition)
		}
		c.log.Warn("admit: cannot read decisions from Kafka; lagged rules follow on_stale until it answers", args...)
	}
}

// decisionsRead notes that partition (or listing) was read.
func (c *Client) decisionsRead(partition int) {
	r := &c.kafka
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.failing[partition] {
		return
	}
	delete(r.failing, partition)
	if len(r.failing) == 0 && !r.downSince.IsZero() {
		c.log.Info("admit: decisions read from Kafka again", "topic", c.cfg.DecisionsTopic,
			"down_for", time.Since(r.downSince).Round(time.Millisecond))
		r.downSince = time.Time{}
	}
}
