package admit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

type exhaustedError struct {
	Binding    string
	Available  string
	RetryAfter time.Duration
	// held: other holders' live grants hold capacity on the binding
	// budget that may come back (Tally's held > 0).
	held bool
}

func (e *exhaustedError) Error() string {
	return fmt.Sprintf("admit: budget %s exhausted (%s available)", e.Binding, e.Available)
}

// unreachableError: Tally did not answer (connection refused, timeout,
// 5xx other than 503), or answered slower than Config.MaxWait.
type unreachableError struct{ err error }

func (e *unreachableError) Error() string { return "admit: Tally unreachable: " + e.err.Error() }
func (e *unreachableError) Unwrap() error { return e.err }

// loadError: Tally refused the call for load (429, or 503 from its
// concurrency limit), asking to come back after RetryAfter.
type loadError struct {
	Status     int
	RetryAfter time.Duration
}

func (e *loadError) Error() string {
	return fmt.Sprintf("admit: Tally refused for load (%d), retry after %s", e.Status, e.RetryAfter)
}

// changingError: Tally could not decide this grant request, its budgets
// (the rules and pool memberships that apply) having changed under each
// attempt (503 budgets-changing). It concerns that budget alone: nothing
// is paused, and the next request for it asks again.
type changingError struct{ RetryAfter time.Duration }

func (e *changingError) Error() string {
	return fmt.Sprintf("admit: the budgets of the request kept changing, retry after %s", e.RetryAfter)
}

// isUnreachable: Tally could not serve the call, for whatever reason it
// did not say no (down, hung, slow, shedding load, or unable to decide
// while the request's budgets kept changing): the rule's on_unreachable
// answers.
func isUnreachable(err error) bool {
	var u *unreachableError
	var l *loadError
	var ch *changingError
	return errors.As(err, &u) || errors.As(err, &l) || errors.As(err, &ch)
}

// notExactError: the rule is lagged ("lagged") or there is none ("none").
type notExactError struct{ Admission string }

func (e *notExactError) Error() string { return "admit: not an exact rule: " + e.Admission }

// TallyError is a refusal by Tally that is not about a budget: the
// client's setup (401 an unknown or revoked token, 403 a token that may
// not act for Holder) or a request Tally found wrong (400, 404, 409 on a
// grant). Admit returns it as an error: it will not go away by itself.
// Check reports the same at start.
type TallyError struct {
	Path   string
	Status int
	// Type is the problem's type, e.g. "urn:tally:problem:unauthorized".
	Type   string
	Detail string
	// next is a stale-generation refusal's next_generation (0 otherwise).
	next int64
}

func (e *TallyError) Error() string {
	return fmt.Sprintf("admit: Tally refused %s: %d %s: %s", e.Path, e.Status, e.Type, e.Detail)
}

type problem struct {
	Admission  string `json:"admission"`
	Type       string `json:"type"`
	Detail     string `json:"detail"`
	Binding    string `json:"binding"`
	Available  string `json:"available"`
	Held       string `json:"held"`
	RetryAfter *int64 `json:"retry_after"`
	// RetryAfterMS: the same in milliseconds, from a Tally that says.
	RetryAfterMS *int64 `json:"retry_after_ms"`
	// NextGeneration: of a stale-generation refusal, the generation a
	// holder that lost its state recovers with.
	NextGeneration *int64 `json:"next_generation"`
}

type grantAnswer struct {
	ID            string    `json:"id"`
	Amount        string    `json:"amount"`
	ValidUntil    time.Time `json:"valid_until"`
	RuleVersion   int64     `json:"rule_version"`
	OnUnreachable Policy    `json:"on_unreachable"`
	LocalAmount   string    `json:"local_amount"`
	LocalEvery    duration  `json:"local_every"`
	// Available: what the budgets drawn have left after this grant (the
	// smallest limit − consumed); empty from a Tally that does not say.
	Available  string `json:"available"`
	LateReport bool   `json:"late_report"`
	// Rate: the grant drew from a rate budget (docs/design.md §17).
	Rate bool `json:"rate"`
}

// duration reads a duration given as a string ("1m") or as whole seconds.
type duration time.Duration

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		*d = duration(v)
		return err
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	*d = duration(time.Duration(n) * time.Second)
	return err
}

// Problem types the client tells apart.
const (
	problemExhausted      = "urn:tally:problem:budget-exhausted"
	problemNotExact       = "urn:tally:problem:not-exact"
	problemGrantEnded     = "urn:tally:problem:grant-ended"
	problemStaleGen       = "urn:tally:problem:stale-generation"
	problemBypassConflict = "urn:tally:problem:bypass-conflict"
	problemChanging       = "urn:tally:problem:budgets-changing"
)

// call POSTs body to path and decodes a 2xx answer into out. It records
// what the answer says of Tally's health: no answer marks it unreachable
// (Admit then answers by on_unreachable at once, with backoff), a refusal
// for load pauses calls for Retry-After, any other answer marks it up.
func (c *Client) call(ctx context.Context, kind, path string, body, out any) error {
	start := time.Now()
	err := c.do(ctx, path, body, out)
	c.metrics.call(kind, err, time.Since(start))
	var u *unreachableError
	var l *loadError
	switch {
	case errors.As(err, &u):
		c.markDown(err)
	case errors.As(err, &l):
		c.markBusy(l.RetryAfter)
	case err == nil || !errors.Is(err, ctx.Err()):
		c.markUp()
	}
	return err
}

func (c *Client) do(ctx context.Context, path string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.cfg.URL+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err() // the caller's bound, not Tally's health
		}
		return &unreachableError{err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &unreachableError{err}
	}
	var p problem
	if resp.StatusCode >= 300 {
		_ = json.Unmarshal(raw, &p) // a body that is not a problem leaves p empty
	}
	switch {
	case p.Type == problemChanging:
		return &changingError{RetryAfter: retryAfter(resp.Header.Get("Retry-After"))}
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
		return &loadError{Status: resp.StatusCode, RetryAfter: retryAfter(resp.Header.Get("Retry-After"))}
	case resp.StatusCode >= 500:
		return &unreachableError{fmt.Errorf("%s: %s", resp.Status, raw)}
	}
	if resp.StatusCode >= 300 {
		switch p.Type {
		case problemExhausted:
			e := &exhaustedError{Binding: p.Binding, Available: p.Available, held: positive(p.Held)}
			switch {
			case p.RetryAfterMS != nil:
				e.RetryAfter = time.Duration(*p.RetryAfterMS) * time.Millisecond
			case p.RetryAfter != nil:
				e.RetryAfter = time.Duration(*p.RetryAfter) * time.Second
			}
			return e
		case problemNotExact:
			return &notExactError{Admission: p.Admission}
		}
		te := &TallyError{Path: path, Status: resp.StatusCode, Type: p.Type, Detail: p.Detail}
		if p.NextGeneration != nil {
			te.next = *p.NextGeneration
		}
		return te
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(raw, out)
}

// retryAfter reads a Retry-After header in seconds; one second when it is
// missing or unreadable (never 0: a storm of immediate retries).
func retryAfter(h string) time.Duration {
	if n, err := strconv.ParseInt(h, 10, 64); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return time.Second
}

// topUp asks for a grant big enough for at least need, sized from the
// measured demand. Caller must not hold b.mu.
func (c *Client) topUp(ctx context.Context, b *budget, need int64) error {
	b.mu.Lock()
	if b.available() >= need || (b.kind.Load() >= kindLagged && !b.unchecked()) {
		b.mu.Unlock()
		return nil // another caller topped up, or found the rule lagged, meanwhile
	}
	err := c.topUpLocked(ctx, b, need)
	c.unlockAndSend(ctx, b)
	return err
}

// unlockAndSend releases b.mu, then keeps and delivers the final spend
// reports of the grants given back under it: the file's fsync and the
// release's round trip never hold up an Admit waiting for b.mu.
func (c *Client) unlockAndSend(ctx context.Context, b *budget) {
	out := b.outbox
	b.outbox = nil
	b.mu.Unlock()
	if len(out) == 0 {
		return
	}
	c.finalReports(ctx, out)
	<-b.sending
}

// target is the grant size: measured demand over Lookahead, never below
// MinGrant; while the budget is tight (a grant came back smaller than
// asked, or was refused, within the last Lookahead), one unit, so a
// top-up asks for what the waiting Admit needs and no more. Near its
// end a budget is then a central counter: a gateway holds nothing another
// gateway's request could have used. Holding even a tick or two of demand
// there left capacity stranded in other gateways when the last requests
// that fit came (docs/performance.md, "Exact admission"). Under b.mu.
func (c *Client) target(b *budget, now time.Time) int64 {
	if b.tight(now) {
		return 1
	}
	t := unitsOver(b.rate, c.cfg.Lookahead)
	// Slow start: at most twice the last grant, so a burst does not hand
	// one gateway a budget others are about to need.
	if b.lastGrant > 0 {
		t = min(t, 2*b.lastGrant)
	}
	return max(t, c.cfg.MinGrant)
}

// tightAfter reads a grant answer's available (left, what the budgets
// drawn have left after the grant): the budget is tight when left is less
// than two lookaheads of the demand of all gateways, so it runs dry
// before every gateway can spend a lookahead's grant. The gateway then
// asks only for what each Admit needs and gives its surplus back at its
// next tick, before another gateway is refused for what it holds. The
// demand of all gateways is measured from how fast available fell between
// this gateway's grant answers (everyone's grants net of what they gave
// back), never below the gateway's own demand. Under b.mu.
func (c *Client) tightAfter(b *budget, now time.Time, left int64) bool {
	switch dt := now.Sub(b.leftAt); {
	case b.leftAt.IsZero():
		b.left, b.leftAt = left, now
	case dt >= c.cfg.Tick:
		b.fell = perSecond(max(b.left-left, 0), dt)
		b.drain = (b.drain + b.fell) / 2
		b.left, b.leftAt = left, now
	default:
		// Too soon after the last reading for a rate: answers that come
		// back to back (a top-up and an Admit's miss, a burst's growing
		// grants) would read one grant as a flood. The fall is measured
		// from that reading once a tick has passed.
	}
	// A burst counts at once (fell), and for a while after (drain).
	demand := max(b.drain, b.fell, b.rate)
	return left < unitsOver(2*demand, c.cfg.Lookahead)
}

// perSecond is units taken over d as a rate in thousandths of a unit per
// second (d > 0).
func perSecond(units int64, d time.Duration) int64 {
	return units * 1_000_000_000 / max(d.Microseconds(), 1)
}

// unitsOver is how many whole units a rate (thousandths of a unit per
// second) takes over d, rounded up.
func unitsOver(rate int64, d time.Duration) int64 {
	const per = 1_000_000_000 // thousandths × microseconds per second
	return (rate*d.Microseconds() + per - 1) / per
}

// refusalMemory is how long Admit answers a refusal from memory when the
// budget is spent (no other gateway holds any of it): one tick after the
// first refusal, doubling with each refusal in a row up to 8 ticks, never
// past retry_after. An exhausted budget then costs a few refused grant
// requests per second, not twenty. A refusal while other gateways hold
// capacity is not remembered at all (topUpLocked).
func (c *Client) refusalMemory(streak int, retryAfter time.Duration) time.Duration {
	wait := c.cfg.Tick << min(streak, 3)
	if retryAfter > 0 {
		wait = min(wait, retryAfter)
	}
	return wait
}

// noteRefusal records that Tally refused b's grant request or debit (ex,
// answered after now): the budget is tight, so the gateway holds little
// of it from now on. When other gateways hold what is left, they give back
// what they do not spend at their next tick: the next Admit asks again
// (remembering the refusal for even a tick refused requests that fit,
// docs/performance.md), and ex's RetryAfter is at most a tick. When the
// budget is spent, not only held, refusals are answered from memory for a
// while (refusalMemory): fewer central calls.
//
// The memory is of need, the least Tally was asked for: an Admit missing
// less than that (a smaller cost, or the same cost while the gateway holds
// more) still asks, since Tally may hold it.
func (c *Client) noteRefusal(b *budget, ex *exhaustedError, now time.Time, need int64) {
	b.tightUntil.Store(now.Add(c.cfg.Lookahead).UnixNano())
	if binding := ex.Binding; binding != "" {
		b.refusedBy.Store(&binding)
	}
	if ex.held {
		ex.RetryAfter = min(ex.RetryAfter, c.cfg.Tick)
		return
	}
	if until := b.refusedUntil.Load(); until == 0 || time.Now().UnixNano() >= until || need < b.refusedNeed.Load() {
		b.refusedNeed.Store(need)
	}
	streak := b.refusals.Add(1) - 1
	b.refusedUntil.Store(time.Now().Add(c.refusalMemory(int(streak), ex.RetryAfter)).UnixNano())
}

// readAvailable reads an answer's available (what the budgets drawn have
// left; "" from a Tally that does not say): b is tight for a Lookahead
// when tightAfter says so. Under b.mu.
func (c *Client) readAvailable(b *budget, now time.Time, available string) {
	if available == "" {
		return
	}
	if left, err := parseUnits(available); err == nil && c.tightAfter(b, now, left) {
		b.tightUntil.Store(now.Add(c.cfg.Lookahead).UnixNano())
	}
}

// noteTaken records that Tally took a grant request or debit of b: the
// refusals in a row, and their memory, end.
func (b *budget) noteTaken() {
	b.refusedUntil.Store(0)
	b.refusals.Store(0)
}

// reportsSent waits, until at the latest, for the final reports b's
// gateway is sending to be delivered, and says whether they were: Tally
// may have refused for capacity they give back, so a refused request is
// asked once more then.
func (b *budget) reportsSent(until time.Time) bool {
	select {
	case b.sending <- struct{}{}:
		<-b.sending
		return true
	case <-time.After(time.Until(until)):
		return false
	}
}

func (c *Client) topUpLocked(ctx context.Context, b *budget, need int64) error {
	if c.closed.Load() {
		return ErrClosed
	}
	// Final reports of grants just given back may still be on their way:
	// ask anyway (most top-ups find capacity without them), and only when
	// Tally refuses, wait for them (until half of MaxWait from here: a
	// stalled send alone never holds a waiting Admit up to MaxWait) and
	// ask once more, since Tally could have refused for capacity about to
	// be back.
	// Not this caller's own outbox: those are sent once b.mu is released.
	inFlight, waitUntil := len(b.sending) > 0 && len(b.outbox) == 0, time.Now().Add(c.cfg.MaxWait/2)
	now := time.Now()
	// The rule version of the decision held when asking: Tally's answer
	// is about that version at least (one read later is not).
	seen := b.decisionVersion()
	// A whole target, not what is missing from it: grants average the
	// target, and each costs an issue and a release. At least what the
	// Admits waiting for this request need together (on a tight budget,
	// the target is one unit).
	size := max(c.target(b, now), need, b.waiting.Load())
	g, sent, err := c.issue(ctx, b, size, need)
	var te *TallyError
	if errors.As(err, &te) && te.Type == problemStaleGen && c.recoverGeneration(sent, te.next) {
		g, sent, err = c.issue(ctx, b, size, need) // once: under the recovered generation
	}
	if _, refused := errors.AsType[*exhaustedError](err); refused && inFlight && b.reportsSent(waitUntil) {
		g, sent, err = c.issue(ctx, b, size, need)
	}
	var ne *notExactError
	if errors.As(err, &ne) {
		c.notExact(b, ne.Admission, seen)
		return err
	}
	var ex *exhaustedError
	if errors.As(err, &ex) {
		c.noteRefusal(b, ex, now, need)
		c.exact(b, seen) // a refusal for lack of budget says the rule is exact
		return err
	}
	if err != nil {
		return err
	}
	b.noteTaken()
	c.exact(b, max(seen, g.RuleVersion))
	if g.OnUnreachable != "" {
		// The rule's policy, learnt with the grant, overrides the default.
		p := policy{how: g.OnUnreachable, every: time.Duration(g.LocalEvery)}
		if g.LocalAmount != "" {
			p.amount, _ = parseUnits(g.LocalAmount)
		}
		b.policy.Store(&p)
	}
	amount, err := parseUnits(g.Amount)
	if err != nil {
		return err
	}
	if amount < size {
		// Less than asked: Tally had no more, the budget is tight.
		b.tightUntil.Store(now.Add(c.cfg.Lookahead).UnixNano())
	}
	c.readAvailable(b, now, g.Available)
	if amount <= 0 {
		// A fractional grant: nothing usable in whole units. Give it back;
		// the budget has less than a unit left.
		c.release(ctx, b, &held{id: g.ID, amount: 0, generation: sent}, 0)
		return &exhaustedError{Binding: b.binding, Available: g.Available}
	}
	b.lastGrant = amount
	// Keep a tick of margin before valid_until: the loop renews or gives
	// back the grant before Tally may consider it expired.
	b.rateBudget.Store(g.Rate)
	b.grants = append(b.grants, &held{id: g.ID, amount: amount, validUntil: g.ValidUntil, generation: sent, rate: g.Rate})
	b.heldGrants.Store(int64(len(b.grants)))
	b.add(amount)
	return nil
}

// issue asks Tally for a grant of size (at least need) under this run's
// generation, and returns the generation it sent. Under b.mu.
func (c *Client) issue(ctx context.Context, b *budget, size, need int64) (grantAnswer, int64, error) {
	c.genMu.RLock()
	defer c.genMu.RUnlock()
	gen := c.generation.Load()
	ttl := c.cfg.GrantTTL
	if b.rateBudget.Load() {
		ttl = c.cfg.RateGrantTTL
	}
	var g grantAnswer
	err := c.call(ctx, "issue", "/v1/grants", map[string]any{
		"holder": c.cfg.Holder, "generation": gen, "customer": b.customer, "meter": b.meter,
		"amount": strconv.FormatInt(size, 10), "min_amount": strconv.FormatInt(need, 10),
		"ttl": ttl.String(),
	}, &g)
	if err == nil {
		c.issued.Store(true)
	}
	return g, gen, err
}

// positive says whether a decimal string is above zero.
func positive(s string) bool {
	if strings.HasPrefix(s, "-") {
		return false
	}
	return strings.ContainsAny(s, "123456789")
}

// parseUnits reads a decimal string as whole units, flooring a fraction
// (the fraction is never admitted, so never over-admitted).
func parseUnits(s string) (int64, error) {
	whole := s
	for i := range len(s) {
		if s[i] == '.' {
			whole = s[:i]
			break
		}
	}
	return strconv.ParseInt(whole, 10, 64)
}

// allocate assigns what was admitted from held grants to them, oldest
// first, and returns each grant's spent.
func (b *budget) allocate() []int64 {
	pending := b.taken() - b.finals
	out := make([]int64, len(b.grants))
	for i, g := range b.grants {
		s := min(g.amount, max(pending, 0))
		out[i] = max(s, g.spent) // spent reports never go backwards
		pending -= s
	}
	return out
}

// release withdraws what g has not spent, forgets it, and queues its final
// spent for finalReports once b.mu is released (unlockAndSend): kept on
// disk, then sent (now, or when Tally answers again). Under b.mu.
func (c *Client) release(ctx context.Context, b *budget, g *held, allocated int64) {
	if len(b.outbox) == 0 {
		// From the withdraw below until the report is delivered, an Admit
		// that finds nothing held sees reports on their way: Tally may
		// refuse it for the capacity they give back (admitByDebit).
		b.sending <- struct{}{}
	}
	w := b.withdraw(g.amount - allocated)
	local := g.amount - w // admitted from g, as far as this gateway knows
	b.finals += local
	final := max(local, g.spent)
	for i, h := range b.grants {
		if h == g {
			b.grants = append(b.grants[:i], b.grants[i+1:]...)
			break
		}
	}
	b.heldGrants.Store(int64(len(b.grants)))
	b.outbox = append(b.outbox, spendReport{Grant: g.id, Holder: c.cfg.Holder, Generation: g.generation,
		Customer: b.customer, Meter: b.meter, Spent: final, ValidUntil: g.validUntil, full: final >= g.amount})
}

// releaseAll gives back every grant of every budget (Close, once no
// top-up can run): their final reports are kept and sent together.
func (c *Client) releaseAll(ctx context.Context) {
	var finals []spendReport
	var sent []*budget
	for b := range c.budgets.all {
		b.mu.Lock()
		for len(b.grants) > 0 {
			alloc := b.allocate()
			n := len(b.grants) - 1
			c.release(ctx, b, b.grants[n], alloc[n])
		}
		if len(b.outbox) > 0 {
			sent = append(sent, b)
		}
		finals = append(finals, b.outbox...)
		b.outbox = nil
		b.mu.Unlock()
	}
	c.finalReports(ctx, finals)
	for _, b := range sent {
		<-b.sending
	}
}

// loop tops up, renews and releases grants, and reports bypasses.
func (c *Client) loop() {
	defer close(c.done)
	t := time.NewTicker(c.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(c.bg, 5*c.cfg.Tick+2*time.Second)
		// The final reports of every budget's grants given back this tick
		// go together: one call for all of them.
		var finals []spendReport
		var sending, quiet, idle []*budget
		for b := range c.budgets.all {
			out, forgettable := c.tend(ctx, b)
			switch {
			case len(out) > 0:
				finals, sending = append(finals, out...), append(sending, b)
			case forgettable:
				idle = append(idle, b)
			default:
				quiet = append(quiet, b)
			}
		}
		if len(finals) > 0 {
			// A call goes anyway: every budget's spent grants go with it
			// (spentHold), a call a second in all, not one per budget.
			for _, b := range quiet {
				if out := c.giveBackSpent(ctx, b); len(out) > 0 {
					finals, sending = append(finals, out...), append(sending, b)
				}
			}
		}
		c.finalReports(ctx, finals)
		for _, b := range sending {
			<-b.sending
		}
		c.forgetIdle(idle)
		if !c.paused(time.Now()) {
			c.deliverReports(ctx, false)
		}
		if !c.paused(time.Now()) {
			c.reportBypasses(ctx)
		}
		c.metrics.observeState(c)
		cancel()
	}
}

// notExact records that b's rule is lagged or absent, as Tally answered
// a request sent while the decision held was of rule version seen. Under
// b.mu.
func (c *Client) notExact(b *budget, admission string, seen int64) {
	k := kindLagged // "lagged", or a Tally that does not say
	if admission == "none" {
		k = kindNoRule
	}
	b.checkedAt = time.Now()
	b.checkedVersion.Store(max(b.checkedVersion.Load(), seen))
	b.kind.Store(k)
}

// exact records that b's rule is exact at rule version v at least: a
// grant was issued or refused for lack of budget. Under b.mu.
func (c *Client) exact(b *budget, v int64) {
	b.checkedVersion.Store(max(b.checkedVersion.Load(), v))
	b.kind.Store(kindExact)
}

// decisionVersion is the rule version of the decision held, 0 without
// one.
func (b *budget) decisionVersion() int64 {
	if l := b.dec.Load(); l != nil {
		return l.d.RuleVersion
	}
	return 0
}

// unchecked says whether the decision held carries a rule version newer
// than the one Tally last told the kind of: the rule may have turned exact
// (or been created exact) since, and a decision says nothing about a
// budget admitted through grants. Admit asks Tally before answering from
// it, so no gateway admits past an exact limit from the lagged decision
// of a rule that is no longer lagged. No lock: Admit's hot path reads it.
func (b *budget) unchecked() bool {
	return b.decisionVersion() > b.checkedVersion.Load()
}

// tendNotExact: a lagged (or absent) rule needs no grants; grants held
// from when it was exact go back, and Tally is asked again after
// RuleRecheck or when a decision brings a new rule version.
func (c *Client) tendNotExact(ctx context.Context, b *budget, now time.Time) {
	for len(b.grants) > 0 {
		alloc := b.allocate()
		n := len(b.grants) - 1
		c.release(ctx, b, b.grants[n], alloc[n])
	}
	if now.Sub(b.checkedAt) < c.cfg.RuleRecheck && !b.unchecked() {
		return
	}
	if c.paused(now) {
		return // asked again once Tally answers
	}
	b.checkedAt = now // also when Tally does not answer: try again later
	// A grant, or a refusal for lack of budget, says the rule is exact
	// now (topUpLocked records it); not exact records the version asked
	// about; unreachable changes nothing, and Admit meanwhile answers
	// from the decision held while its version is the one checked, and
	// asks Tally itself while it is newer.
	_ = c.topUpLocked(ctx, b, 1)
}

// tend is one round of the loop for one budget.
// tend is one round of the loop for one budget. It returns the final
// spend reports of the grants it gave back, for the caller to send once
// b.mu is released; when there are any, b.sending is full until the
// caller empties it once they are sent.
func (c *Client) tend(ctx context.Context, b *budget) (out []spendReport, forgettable bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c.tendLocked(ctx, b)
	forgettable = c.forgettable(b, time.Now()) // notes when b was last used
	out = b.takeOutbox()
	return out, forgettable && len(out) == 0
}

// giveBackSpent gives back b's fully spent grants now, and returns their
// final reports as tend does.
func (c *Client) giveBackSpent(ctx context.Context, b *budget) []spendReport {
	b.mu.Lock()
	defer b.mu.Unlock()
	c.releaseSpent(ctx, b)
	return b.takeOutbox()
}

// takeOutbox empties b's outbox for the caller to send once b.mu is
// released; when it returns reports, b.sending is full (since the first
// of them was queued, release) until the caller empties it once they are
// sent. Under b.mu.
func (b *budget) takeOutbox() []spendReport {
	out := b.outbox
	b.outbox = nil
	return out
}

// releaseSpent gives back b's fully spent grants. Under b.mu.
func (c *Client) releaseSpent(ctx context.Context, b *budget) {
	alloc := b.allocate()
	for i := len(b.grants) - 1; i >= 0; i-- {
		if g := b.grants[i]; alloc[i] >= g.amount {
			c.release(ctx, b, g, alloc[i])
		}
	}
}

func (c *Client) tendLocked(ctx context.Context, b *budget) {
	now := time.Now()
	if b.kind.Load() >= kindLagged {
		c.tendNotExact(ctx, b, now)
		return
	}
	// A decision with a newer rule version than the grants': the rule may
	// have turned lagged. A grant request tells (once per version).
	if b.kind.Load() == kindExact && b.unchecked() && !c.paused(now) {
		b.checkedVersion.Store(b.decisionVersion())
		_ = c.topUpLocked(ctx, b, 1) // refused not-exact: kind turns lagged
		if b.kind.Load() >= kindLagged {
			c.tendNotExact(ctx, b, now) // gives the grants back
			return
		}
	}
	taken := b.taken()
	if dt := now.Sub(b.lastAt); dt > 0 {
		inst := perSecond(taken-b.lastTaken, dt)
		b.rate = (7*b.rate + 3*inst) / 10
		if b.misses.Swap(0) > 0 && b.rate < inst*2 {
			b.rate = max(b.rate, inst) * 3 / 2 // ran dry: grow faster
		}
	}
	b.lastTaken, b.lastAt = taken, now

	// Grants about to run out: give back what is unspent while Tally can
	// still take it. Fully spent ones free nothing when they end, so they
	// wait to go together (spentHold), or with any other release.
	alloc := b.allocate()
	spent, spentDue := 0, false
	for i, g := range b.grants {
		if alloc[i] < g.amount {
			continue
		}
		spent++
		if g.spentAt.IsZero() {
			g.spentAt = now
		}
		spentDue = spentDue || now.Sub(g.spentAt) >= spentHold
	}
	for i := len(b.grants) - 1; i >= 0; i-- {
		if g := b.grants[i]; now.Add(2 * c.cfg.Tick).After(g.validUntil) {
			c.release(ctx, b, g, alloc[i])
		}
	}
	if spentDue || spent >= maxSpentHeld || len(b.outbox) > 0 {
		c.releaseSpent(ctx, b)
	}
	// A budget no Admit has used for half a grant's TTL gives back the
	// grants due for renewal instead of renewing them: an idle gateway
	// holds no capacity other gateways may be refused for, and makes no
	// renew calls for a customer that stopped sending.
	if now.Sub(b.usedAt) >= c.cfg.GrantTTL/2 && b.waiting.Load() == 0 {
		alloc = b.allocate()
		for i := len(b.grants) - 1; i >= 0; i-- {
			if g := b.grants[i]; !g.rate && g.validUntil.Sub(now) < c.cfg.GrantTTL/2 {
				c.release(ctx, b, g, alloc[i])
			}
		}
	}
	// Renew the rest when half their TTL is gone. A renew Tally does not
	// take (down, or refused for load) is tried again at the next tick
	// after the pause (Retry-After, or the backoff), until the grant is
	// released above, two ticks before its valid_until.
	alloc = b.allocate()
	unspent := 0 // grants held with capacity left (spent ones wait for spentHold)
	for i, g := range b.grants {
		if alloc[i] >= g.amount {
			continue
		}
		unspent++
		if !g.rate && g.validUntil.Sub(now) < c.cfg.GrantTTL/2 && !c.paused(time.Now()) {
			var ans grantAnswer
			err := c.call(ctx, "renew", "/v1/grants/"+g.id+"/renew", map[string]any{
				"holder": c.cfg.Holder, "generation": g.generation, "spent": strconv.FormatInt(alloc[i], 10),
				"ttl": c.cfg.GrantTTL.String(),
			}, &ans)
			if err == nil {
				g.spent, g.validUntil = alloc[i], ans.ValidUntil
			}
		}
	}
	target := c.target(b, now)
	avail := b.available()
	// Top up before running dry.
	if avail < target/2 && time.Now().UnixNano() >= b.refusedUntil.Load() && unspent > 0 && !c.paused(time.Now()) {
		_ = c.topUpLocked(ctx, b, 1)
	}
	// Give back what demand no longer needs: the newest grant, when what
	// is left without it still covers the target twice, or when what is
	// held is more than three times the target (the next miss asks for a
	// grant sized to the demand then). While the budget is tight the
	// target is one unit, so a gateway keeps little more than it is
	// about to spend and a refused one finds the rest. Never what
	// the Admits waiting for a grant are about to take from it.
	alloc = b.allocate()
	for n := len(b.grants) - 1; n >= 0; n-- {
		g := b.grants[n]
		if alloc[n] >= g.amount {
			continue // spent: goes back with the others (spentHold)
		}
		left := avail - (g.amount - alloc[n])
		if (left > 2*target || avail > 3*target) && left >= b.waiting.Load() {
			c.release(ctx, b, g, alloc[n])
		}
		break
	}
}

// A fully spent grant frees nothing when it goes back: it only closes
// Tally's record of it (until then Tally counts its whole amount as
// consumed, as it is). So spent grants go back together, the first of
// them spentHold after it was found spent, or once maxSpentHeld are held,
// or with any grant given back (of any budget: the loop's one call a tick
// takes them all): on a tight budget, where every grant is one request's
// cost and spent as it arrives, a gateway sends about a release call a
// second instead of one a tick. A crash meanwhile costs nothing either:
// Tally reclaims them as spent in full, which they are.
const (
	spentHold    = time.Second
	maxSpentHeld = 64
)
