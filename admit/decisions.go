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
	if d.AsOf != nil {
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
	if b := (*c.budgets.Load())[k]; b != nil {
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
		c.log.Warn("admit: cannot list the decision topic's partitions; lagged rules follow on_stale meanwhile",
			"topic", c.cfg.DecisionsTopic, "err", err, "retry_in", wait)
		if !pause.For(ctx, wait) {
			return
		}
	}
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
		c.log.Warn("admit: cannot position the decision reader", "partition", partition, "err", err)
		if !pause.For(ctx, time.Second) {
			return
		}
	}
	for {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.log.Error("admit: read decisions", "partition", partition, "err", err)
			if !pause.For(ctx, time.Second) {
				return
			}
			continue
		}
		var d quota.Decision
		if err := json.Unmarshal(m.Value, &d); err != nil || d.Customer == "" || d.Meter == "" {
			c.log.Warn("admit: not a decision; skipped", "partition", partition, "offset", m.Offset, "err", err)
			continue
		}
		c.onDecision(d)
	}
}
