package admit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admit"
)

// admitN admits n units one at a time and fails the test on a refusal.
func admitN(t *testing.T, c *admit.Client, n int) {
	t.Helper()
	for i := range n {
		d, err := c.Admit(context.Background(), "acme", "tokens", 1)
		if err != nil || !d.Admitted {
			t.Fatalf("admit %d: %+v %v", i, d, err)
		}
	}
}

// closeSettled closes c and checks that acme's tokens budget consumed
// exactly the admitted units, with nothing left live: every grant went
// back with its true spent.
func closeSettled(t *testing.T, ts *tally, c *admit.Client, admitted int64) {
	t.Helper()
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if b := ts.budget("acme", "tokens"); !b.Consumed.Equal(decimal.NewFromInt(admitted)) || !b.Live.IsZero() {
		t.Fatalf("admitted %d, budget %+v", admitted, b)
	}
}

// A top-up asks for a whole grant, not for what is missing from the
// target: with grants of 50, a gateway that spent 30 of its first grant
// holds two grants of 50.
func TestTopUpAsksForAWholeGrant(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000")
	ctx := context.Background()
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{MinGrant: 50, Lookahead: time.Nanosecond})
	defer c.Close(ctx)
	admitN(t, c, 30)
	eventually(t, "a second grant of 50", func() bool {
		return ts.budget("acme", "tokens").Live.Equal(decimal.NewFromInt(100))
	})
	closeSettled(t, ts, c, 30)
}

// A grant smaller than asked says the budget is nearly all granted: the
// gateway then holds only a few ticks of its demand and gives the rest
// back while it keeps admitting, so another gateway can get it.
func TestPartialGrantMakesGatewayHoldLittle(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "500")
	ctx := context.Background()
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{MinGrant: 1000})
	defer c.Close(ctx)
	admitN(t, c, 1) // asks 1,000, gets the 500 there are
	eventually(t, "most of the budget given back while admitting", func() bool {
		admitN(t, c, 1)
		return ts.budget("acme", "tokens").Live.LessThanOrEqual(decimal.NewFromInt(100))
	})
	other := newClient(t, ts, "gw2", t.TempDir(), admit.Config{MinGrant: 1})
	defer other.Close(ctx)
	d, err := other.Admit(ctx, "acme", "tokens", 1)
	if err != nil || !d.Admitted {
		t.Fatalf("the other gateway was refused: %+v %v", d, err)
	}
}

// besideAHolderOf700 returns gw1 on acme's tokens budget (a limit of
// 1,000 set by the caller) after gw2 took a grant of 700 there: gw1's
// first grant request, for 1,000, gets the 300 left, which makes the
// budget tight for gw1.
func besideAHolderOf700(t *testing.T, ts *tally) *admit.Client {
	t.Helper()
	ctx := context.Background()
	gw2 := newClient(t, ts, "gw2", t.TempDir(), admit.Config{MinGrant: 700})
	t.Cleanup(func() { _ = gw2.Close(ctx) })
	if d, err := gw2.Admit(ctx, "acme", "tokens", 1); err != nil || !d.Admitted {
		t.Fatalf("gw2: %+v %v", d, err)
	}
	gw1 := newClient(t, ts, "gw1", t.TempDir(), admit.Config{MinGrant: 1000})
	t.Cleanup(func() { _ = gw1.Close(ctx) })
	return gw1
}

// While a budget is tight a gateway holds nothing and has each Admit's
// cost debited: near its end the budget is a central counter, and nothing
// a gateway holds strands capacity another gateway's request could use.
// Here gw2 holds 700 of 1,000, gw1 asks for 1,000 and gets the 300 left
// (tight), and then admits about a hundred requests a second: after the
// first grant its central calls are debits of the Admit's 1 (a grant of a
// few ticks of demand, as a gateway once held there, would be 10 or more),
// and any grant it still asks for is of 1.
func TestTightBudgetIsDebitedByTheRequestsCost(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000")
	var mu sync.Mutex
	var asked, debited []string
	watch := func(r *http.Request) int {
		if req := readBody(r); req.Holder == "gw1" {
			mu.Lock()
			switch r.URL.Path {
			case "/v1/grants":
				asked = append(asked, req.Amount)
			case "/v1/grants/debits":
				debited = append(debited, req.Amount)
			}
			mu.Unlock()
		}
		return 0
	}
	admitOnATightBudget(t, ts, watch, 5*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(asked) < 1 || asked[0] != "1000" || len(debited) < 10 {
		t.Fatalf("gw1's grant requests %v and debits %v (the first grant for 1,000, then at least ten debits)", asked, debited)
	}
	for i, a := range asked[1:] {
		if a != "1" {
			t.Fatalf("grant request %d of gw1 on the tight budget asked for %s, not the Admit's 1 (all: %v)", i+1, a, asked)
		}
	}
	for i, a := range debited {
		if a != "1" {
			t.Fatalf("debit %d of gw1 was of %s, not the Admit's 1 (all: %v)", i, a, debited)
		}
	}
}

// Admits that arrive together on a tight budget are all admitted while it
// has room: they share one grant request when they can, and one that finds
// the grant it waited for taken by the others asks again (within MaxWait)
// instead of being refused for capacity Tally still has.
func TestConcurrentAdmitsOnATightBudgetAreAllAdmitted(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000")
	ctx := context.Background()
	gw1 := besideAHolderOf700(t, ts)
	admitN(t, gw1, 1)                  // asks 1,000, gets the 300 left: tight
	time.Sleep(200 * time.Millisecond) // the surplus goes back
	for round := range 5 {
		var wg sync.WaitGroup
		refused := make(chan string, 20)
		for range 20 {
			wg.Go(func() {
				d, err := gw1.Admit(ctx, "acme", "tokens", 1)
				if err != nil || !d.Admitted {
					refused <- fmt.Sprintf("%+v %v", d, err)
				}
			})
		}
		wg.Wait()
		close(refused)
		for r := range refused {
			t.Errorf("round %d: refused with %d of 1,000 admitted: %s", round, 1+20*round, r)
		}
	}
}

// A grant whose answer says the budget will run dry within two lookaheads
// of the demand of all gateways makes the gateway hold little, though it
// got all it asked for: gw1 takes 100 of 1,000 (900 left), gw2 takes 700,
// gw1's next 100 leave 100: the budget fell by 800 between gw1's answers.
// gw1 then asks for no more than a few ticks of its demand and gives back
// what it holds beyond that while it keeps admitting, so the last 100 stay
// available to gw2. A gateway that learnt of the tight budget only from
// its own partial or refused grant takes the last 100 first.
func TestGrantLeavingBudgetTightMakesGatewayHoldLittle(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000")
	ctx := context.Background()
	gw1 := newClient(t, ts, "gw1", t.TempDir(), admit.Config{MinGrant: 100})
	defer gw1.Close(ctx)
	gw2 := newClient(t, ts, "gw2", t.TempDir(), admit.Config{MinGrant: 700})
	defer gw2.Close(ctx)
	admitN(t, gw1, 1)
	d, err := gw2.Admit(ctx, "acme", "tokens", 1)
	if err != nil || !d.Admitted {
		t.Fatalf("gw2: %+v %v", d, err)
	}
	for range 100 { // spends the first grant: a second of 100, all asked for
		admitN(t, gw1, 1)
		time.Sleep(10 * time.Millisecond) // a demand of about 100/s, not a burst
	}
	var least decimal.Decimal
	eventually(t, "gw1 holding little", func() bool {
		admitN(t, gw1, 1)
		b := ts.budget("acme", "tokens")
		if least = b.Available; b.Available.IsZero() {
			return true
		}
		return b.Live.LessThanOrEqual(decimal.NewFromInt(700 + 30))
	})
	if least.IsZero() {
		t.Fatal("gw1 took the whole budget before giving any back")
	}
}

// A grant fetched for a waiting Admit is not given back before that Admit
// takes from it: the loop's "hold little" give-back (a partial grant on a
// tight budget, no demand measured yet) once ran between the grant's
// arrival and the waiter's take, and the waiter was refused as if the
// budget were spent. A 1 ms Tick makes the loop run in that window often.
func TestWaitingAdmitKeepsTheGrantItWaitedFor(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "500")
	ctx := context.Background()
	for i := range 40 {
		c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{MinGrant: 1000, Tick: time.Millisecond})
		d, err := c.Admit(ctx, "acme", "tokens", 1)
		if err != nil || !d.Admitted {
			t.Fatalf("round %d: the first Admit, on a 500 grant of the 1,000 asked: %+v %v", i, d, err)
		}
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if b := ts.budget("acme", "tokens"); !b.Consumed.Equal(decimal.NewFromInt(40)) || !b.Live.IsZero() {
		t.Fatalf("admitted 40, budget %+v", b)
	}
}

// A top-up (or, on a tight budget, a debit) does not wait for the final
// reports its gateway is sending,
// but when Tally refuses it while they are on their way, it waits for
// them and asks once more: Tally may have refused for capacity they give
// back. Here the only grant (10 of a limit of 10, 1 spent) is being given
// back when an Admit of 5 needs a grant; the release is held until Tally
// has refused that grant request.
func TestTopUpRefusedWhileReportsInFlightAsksAgain(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "10")
	ctx := context.Background()
	blocked, unblock := make(chan struct{}), make(chan struct{})
	var releasing, refused atomic.Bool
	hold := func(r *http.Request) int {
		if strings.HasSuffix(r.URL.Path, "/release") && releasing.CompareAndSwap(false, true) {
			close(blocked)
			<-unblock
		}
		return 0
	}
	ts.refuse.Store(&hold)
	after := func(r *http.Request, status int) {
		if (r.URL.Path == "/v1/grants" || r.URL.Path == "/v1/grants/debits") && status != http.StatusOK && status != http.StatusCreated &&
			releasing.Load() && refused.CompareAndSwap(false, true) {
			close(unblock)
		}
	}
	ts.served.Store(&after)
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{MinGrant: 1000})
	defer c.Close(ctx)
	admitN(t, c, 1) // asks 1,000, gets the 10 there are: tight, so it gives 9 back
	select {
	case <-blocked:
	case <-time.After(time.Minute):
		t.Fatal("the grant was not given back")
	}
	d, err := c.Admit(ctx, "acme", "tokens", 5)
	if err != nil || !d.Admitted {
		t.Fatalf("admit 5 while 9 were being given back: %+v %v (a grant request refused first: %v)", d, err, refused.Load())
	}
	if !refused.Load() {
		t.Fatal("the grant request was not refused while the release was held: the test did not test the retry")
	}
	closeSettled(t, ts, c, 6)
}

// An Admit whose cost is all a gateway holds is admitted: the capacity
// is spread over the client's shards (one per CPU), and no one shard
// holds the whole cost.
func TestAdmitTakesAllThatIsHeld(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "5")
	ctx := context.Background()
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{})
	defer c.Close(ctx)
	d, err := c.Admit(ctx, "acme", "tokens", 5) // asks 10 (MinGrant), gets the 5 there are
	if err != nil || !d.Admitted {
		t.Fatalf("admit 5 of a limit of 5: %+v %v", d, err)
	}
	closeSettled(t, ts, c, 5)
}

// A burst on a budget with room to spare is not tight: grants grow with
// the demand and the gateway asks Tally a few dozen times for 20,000
// admissions. Grant answers arriving in quick succession once made the
// measured drain of the budget a flood (hundreds of thousands of units a
// second), the budget tight, and every Admit a grant request of one unit:
// thousands of them, until Tally's per-token limit paused the gateway.
func TestABurstWithRoomToSpareIsNotTight(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000000")
	var grants atomic.Int64
	count := func(r *http.Request) int {
		if r.URL.Path == "/v1/grants" {
			grants.Add(1)
		}
		return 0
	}
	ts.refuse.Store(&count)
	ctx := context.Background()
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{MinGrant: 10})
	defer c.Close(ctx)
	const burst = 20_000
	for i := range burst {
		d, err := c.Admit(ctx, "acme", "tokens", 1)
		if err != nil || !d.Admitted {
			t.Fatalf("admit %d: %+v %v (after %d grant requests)", i, d, err, grants.Load())
		}
	}
	// Slow start from MinGrant takes about a dozen. A loop of Admits at
	// full speed can also be fast enough (hundreds of thousands a second)
	// for the rule to call the budget tight for a Lookahead, which on a
	// loaded machine cost a few hundred one-unit requests. The defect
	// took 1,500 to several thousand, or Tally's per-token limit refused
	// the gateway (the Admit above fails then). TestBackToBackAnswers
	// tests the reading itself.
	n := grants.Load()
	t.Logf("%d grant requests for %d admissions", n, burst)
	if n > 1_000 {
		t.Fatalf("%d grant requests for %d admissions on a budget of 1,000,000", n, burst)
	}
}

// On a tight budget an Admit's cost is debited: nothing is held, so
// nothing goes back. gw1's central calls over 1.5 s of a tight budget are
// a hundred or more debits and a few release calls (of the grant it held
// when the budget turned tight), not a release per request.
func TestTightBudgetMakesNoReleasePerRequest(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000")
	var releases, central atomic.Int64
	count := func(r *http.Request) int {
		if readBody(r).Holder != "gw1" {
			return 0
		}
		switch {
		case strings.HasSuffix(r.URL.Path, "/release"):
			releases.Add(1)
		case r.URL.Path == "/v1/grants" || r.URL.Path == "/v1/grants/debits":
			central.Add(1)
		}
		return 0
	}
	admitOnATightBudget(t, ts, count, 10*time.Millisecond)
	if n, g := releases.Load(), central.Load(); n > 6 || g < 100 {
		t.Fatalf("gw1 sent %d release calls for %d grant requests and debits over 1.5 s of a tight budget", n, g)
	}
}

// grantBody is what the tests read of a grant, renew or release request.
type grantBody struct {
	Holder string `json:"holder"`
	Amount string `json:"amount"`
}

// readBody reads r's body as a grantBody and puts it back for the API.
func readBody(r *http.Request) grantBody {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req grantBody
	_ = json.Unmarshal(body, &req)
	return req
}

// admitOnATightBudget has Tally's requests watched, then gw1, beside a
// holder of 700 of acme's 1,000 tokens, admit one unit 150 times, a pause
// of every after each.
func admitOnATightBudget(t *testing.T, ts *tally, watch func(*http.Request) int, every time.Duration) {
	t.Helper()
	ts.refuse.Store(&watch)
	gw1 := besideAHolderOf700(t, ts)
	for range 150 {
		admitN(t, gw1, 1)
		time.Sleep(every)
	}
}

// A refusal while another gateway holds capacity it may give back is not
// remembered: the next Admit asks Tally again, and is admitted as soon as
// the other gateway has given its grant back, with a RetryAfter of at
// most a tick. A refusal of a budget that is spent (no other gateway
// holds any) is remembered: the next Admit is answered without a call.
func TestRefusalWhileOthersHoldIsNotRemembered(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "10")
	ts.exactRule("beta", "tokens", "1")
	ctx := context.Background()
	var grantCalls atomic.Int64
	count := func(r *http.Request, _ int) {
		if r.URL.Path == "/v1/grants" || r.URL.Path == "/v1/grants/debits" {
			grantCalls.Add(1) // a debit, once the budget is tight
		}
	}
	ts.served.Store(&count)
	// gw1 holds the whole budget, spending little, and gives nothing back
	// before the test ends (its tick is long).
	gw1 := newClient(t, ts, "gw1", t.TempDir(), admit.Config{MinGrant: 10, Tick: time.Minute})
	admitN(t, gw1, 1)
	gw2 := newClient(t, ts, "gw2", t.TempDir(), admit.Config{})
	defer gw2.Close(ctx)
	refusedAsking := func(customer string) admit.Decision {
		t.Helper()
		before := grantCalls.Load()
		d, err := gw2.Admit(ctx, customer, "tokens", 1)
		if err != nil || d.Admitted || d.How != admit.Exhausted {
			t.Fatalf("%s: %+v %v, want a refusal", customer, d, err)
		}
		if n := grantCalls.Load() - before; n != 1 {
			t.Fatalf("%s: the refusal made %d grant calls, want 1 (asked Tally)", customer, n)
		}
		return d
	}
	for i := range 3 {
		if d := refusedAsking("acme"); d.RetryAfter > 50*time.Millisecond {
			t.Fatalf("refusal %d while gw1 holds 9: retry after %s, want at most a tick", i, d.RetryAfter)
		}
	}
	if err := gw1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	d, err := gw2.Admit(ctx, "acme", "tokens", 1)
	if err != nil || !d.Admitted {
		t.Fatalf("admit once gw1 gave its 9 back: %+v %v", d, err)
	}

	// beta's one unit is spent by gw2 itself: nothing held elsewhere.
	if d, err := gw2.Admit(ctx, "beta", "tokens", 1); err != nil || !d.Admitted {
		t.Fatalf("beta's first unit: %+v %v", d, err)
	}
	refusedAsking("beta")
	before := grantCalls.Load()
	d, err = gw2.Admit(ctx, "beta", "tokens", 1)
	if err != nil || d.Admitted || d.RetryAfter <= 0 {
		t.Fatalf("beta again: %+v %v, want a refusal from memory", d, err)
	}
	if n := grantCalls.Load() - before; n != 0 {
		t.Fatalf("a spent budget's refusal was not remembered: %d grant calls", n)
	}
}
