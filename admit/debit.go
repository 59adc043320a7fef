package admit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
)

// Debits (docs/gateways-exact.md, "Tight budgets: debits"). While a
// budget is tight, a grant sized for it is the size of the request that
// waits for it, and goes back at the next tick: a central counter that
// costs an issue, a release and a grant row per request, behind the issue
// batch in flight. A debit is that counter itself: Tally takes the
// request's cost from every budget that applies, all or nothing, in one
// call and (usually) one round trip to Postgres, and the gateway holds
// nothing. The trade is a counter's: a debit whose answer comes after
// MaxWait (or after ctx ends) may have been taken while the request was
// answered by on_unreachable.

// admitByDebit asks Tally to debit cost, waiting at most MaxWait (and ctx).
func (c *Client) admitByDebit(ctx context.Context, customer, meter string, cost int64, b *budget) (Decision, error) {
	if c.closed.Load() {
		return Decision{}, ErrClosed
	}
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, c.cfg.MaxWait)
	defer cancel()
	// Final reports of grants this gateway just gave back may be on their
	// way (the budget turned tight while it held some).
	inFlight := len(b.sending) > 0
	seen := b.decisionVersion()
	id := uuid.New()
	ans, sent, err := c.debit(dctx, b, id, cost)
	var te *TallyError
	if errors.As(err, &te) && te.Type == problemStaleGen && c.recoverGeneration(sent, te.next) {
		ans, _, err = c.debit(dctx, b, id, cost) // nothing was taken under the older generation
	}
	if _, refused := errors.AsType[*exhaustedError](err); refused && inFlight && b.reportsSent(start.Add(c.cfg.MaxWait/2)) {
		// Tally may have refused for capacity those reports gave back:
		// asked once more, as a top-up does.
		ans, _, err = c.debit(dctx, b, id, cost)
	}
	now := time.Now()
	var ex *exhaustedError
	var ne *notExactError
	switch {
	case err == nil:
		// How tight the budget is now, when b.mu is free (the loop may hold
		// it across a renew's round trip; the reading is advice, and the
		// next answer brings another).
		if b.mu.TryLock() {
			c.readAvailable(b, now, ans.Available)
			b.mu.Unlock()
		}
		b.noteTaken()
		return Decision{Admitted: true, How: Debited}, nil
	case errors.As(err, &ex):
		c.noteRefusal(b, ex, now, cost)
		return Decision{How: Exhausted, Binding: ex.Binding, RetryAfter: ex.RetryAfter}, nil
	case errors.As(err, &ne):
		// Recorded when b.mu is free, as above: the loop may hold it across
		// a renew's round trip, and this Admit must not wait for that. When
		// not recorded, the next Admit asks again (and the loop's grant
		// request for the decision's rule version records it).
		if b.mu.TryLock() {
			c.notExact(b, ne.Admission, seen)
			b.mu.Unlock()
		}
		return c.fromDecision(b), nil
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		c.markDown(fmt.Errorf("no answer to a debit within MaxWait (%s)", c.cfg.MaxWait))
		return c.unreachable(customer, meter, cost, b)
	case isUnreachable(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return c.unreachable(customer, meter, cost, b)
	}
	return Decision{}, err
}

// debit sends one debit under this run's generation and returns the
// generation it sent.
func (c *Client) debit(ctx context.Context, b *budget, id uuid.UUID, cost int64) (grantAnswer, int64, error) {
	c.genMu.RLock()
	defer c.genMu.RUnlock()
	gen := c.generation.Load()
	var g grantAnswer
	err := c.call(ctx, "debit", "/v1/grants/debits", map[string]any{
		"id": id.String(), "holder": c.cfg.Holder, "generation": gen, "customer": b.customer, "meter": b.meter,
		"amount": strconv.FormatInt(cost, 10),
	}, &g)
	if err == nil {
		c.issued.Store(true)
	}
	return g, gen, err
}
