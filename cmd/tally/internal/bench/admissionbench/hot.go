package admissionbench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/quota"
	"github.com/tally-ledger/tally/tokens"
)

// HotBudgetKeys name the budgets a hot-key request can draw on
// (docs/design.md §13): its customer's, one pool holding every customer,
// and the global budget.
var HotBudgetKeys = []string{"customer", "pool", "global"}

// HotOptions shape the hot-key run (`tally bench admission --budgets`).
// Zero values take the defaults in brackets.
type HotOptions struct {
	// DatabaseURL names a migrated database the run may fill (required).
	DatabaseURL string
	// Budgets every grant draws on, of HotBudgetKeys [customer].
	Budgets  []string
	Holders  int           // concurrent holders, one customer each [50]
	Duration time.Duration // of each measured row [5s]
	// APIPoolSize: Postgres connections of the REST API's pool and of the
	// in-process store's [4, `tally serve`'s --api-pool-size default].
	APIPoolSize int
	Logger      *slog.Logger
}

func (o *HotOptions) defaults() {
	if len(o.Budgets) == 0 {
		o.Budgets = []string{"customer"}
	}
	if o.Holders == 0 {
		o.Holders = 50
	}
	if o.Duration == 0 {
		o.Duration = 5 * time.Second
	}
	if o.APIPoolSize == 0 {
		o.APIPoolSize = 4
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports every problem of o (after defaults) at once.
func (o HotOptions) Validate() error {
	o.defaults()
	var errs []error
	if o.DatabaseURL == "" {
		errs = append(errs, errors.New("admissionbench: DatabaseURL is required"))
	}
	for _, b := range o.Budgets {
		if !slices.Contains(HotBudgetKeys, b) {
			errs = append(errs, fmt.Errorf("budgets: %q is not one of %s", b, strings.Join(HotBudgetKeys, ", ")))
		}
	}
	if o.Holders < 1 || o.Holders > 500 {
		errs = append(errs, fmt.Errorf("holders: %d must be 1 to 500", o.Holders))
	}
	if o.Duration < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("duration: %s must be at least 100ms", o.Duration))
	}
	if o.APIPoolSize < 1 {
		errs = append(errs, fmt.Errorf("api-pool-size: %d must be positive", o.APIPoolSize))
	}
	return errors.Join(errs...)
}

func (o HotOptions) draws(b string) bool { return slices.Contains(o.Budgets, b) }

// HotRow is one way of taking from the budgets, measured.
type HotRow struct {
	Name string
	// Grants taken (each released at once with its unit spent, for the
	// exact rows); Refused and Errors should stay 0 (the limits are far).
	Grants, Refused, Errors int64
	Elapsed                 time.Duration
	// P50 and P99 of the grant request (POST /v1/grants, Store.Issue, the
	// counter's statement) as the holder sees it.
	P50, P99 time.Duration
	Problems []string
}

// PerSecond is grants per second.
func (r HotRow) PerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Grants) / r.Elapsed.Seconds()
}

// BudgetState is one budget's consumed and live units, as read back.
type BudgetState struct {
	Budget         string
	Consumed, Live decimal.Decimal
}

// HotRefusal is the phase where the global budget is tight: every holder
// asks once, global refuses, and nothing else moves.
type HotRefusal struct {
	Skipped string // why it did not run (global not among the budgets)
	// Requests sent, Refused of them with the global budget binding.
	Requests, Refused int64
	Before, After     []BudgetState
	Problems          []string
}

// HotResult is a hot-key run's figures.
type HotResult struct {
	Options HotOptions
	Rows    []HotRow
	Refusal HotRefusal
}

// hotRun is the set-up of one run: the API, its customers and tokens.
type hotRun struct {
	o         HotOptions
	pool      *pgxpool.Pool
	store     *admission.Store
	spool     *pgxpool.Pool // the in-process store's
	api       *apiServer
	client    *http.Client
	tr        *http.Transport
	id, pname string
	names     []string // customers, one per holder
	holders   []string
	tokens    []string
}

// hotLimit is every rule's limit in the measured rows: far beyond reach.
var hotLimit = decimal.NewFromInt(1_000_000_000_000)

// RunHot measures grants on the named budgets with Holders concurrent
// holders, each serving its own customer, all customers in one pool:
// through the REST API, through the admission store in process, and the
// central Postgres counter as baseline; then the refusal phase.
func RunHot(ctx context.Context, o HotOptions) (res HotResult, err error) {
	if err := o.Validate(); err != nil {
		return HotResult{}, err
	}
	o.defaults()
	res.Options = o
	h := &hotRun{o: o, id: runID()}
	defer func() { err = errors.Join(err, h.close(context.WithoutCancel(ctx))) }()
	if err := h.setUp(ctx); err != nil {
		return res, err
	}
	for _, way := range []struct {
		name, meter string
		take        func(ctx context.Context, i int, meter string) (bool, time.Duration, error)
		released    bool
	}{
		{"exact, REST API (POST /v1/grants + release)", "hot-rest", h.takeREST, true},
		{"exact, admission store in process (Issue + Release)", "hot-store", h.takeStore, true},
		{"exact, admission store in process, issue only (grants left live)", "hot-issue", h.takeIssue, false},
	} {
		if err := h.rules(ctx, way.meter, hotLimit); err != nil {
			return res, err
		}
		row := h.measure(ctx, way.name, func(ctx context.Context, i int) (bool, time.Duration, error) { return way.take(ctx, i, way.meter) })
		probs, err := h.check(ctx, way.meter, row.Grants, way.released)
		if err != nil {
			return res, err
		}
		row.Problems = append(row.Problems, probs...)
		res.Rows = append(res.Rows, row)
	}
	row, err := h.counter(ctx)
	if err != nil {
		return res, err
	}
	res.Rows = append(res.Rows, row)
	if !o.draws("global") {
		res.Refusal.Skipped = "not run: global is not among the budgets"
	} else if res.Refusal, err = h.refusal(ctx, "hot-rest"); err != nil {
		return res, err
	}
	return res, nil
}

func (h *hotRun) setUp(ctx context.Context) (err error) {
	if h.pool, err = newPool(ctx, h.o.DatabaseURL, h.o.APIPoolSize); err != nil {
		return err
	}
	if h.api, err = serveAPI(ctx, h.pool, h.o.Logger); err != nil {
		return err
	}
	// The in-process row has a pool of the same size of its own.
	if h.spool, err = newPool(ctx, h.o.DatabaseURL, h.o.APIPoolSize); err != nil {
		return err
	}
	if h.store, err = admission.New(h.spool, admission.Config{}); err != nil {
		return err
	}
	h.tr = http.DefaultTransport.(*http.Transport).Clone()
	h.tr.MaxIdleConnsPerHost = h.o.Holders
	h.client = &http.Client{Timeout: 10 * time.Second, Transport: h.tr}
	h.pname = "hot-" + h.id
	for i := range h.o.Holders {
		h.names = append(h.names, fmt.Sprintf("hot-%s-c%03d", h.id, i))
		holder := fmt.Sprintf("hot-%s-gw%03d", h.id, i)
		_, tok, err := tokens.CreateGateway(ctx, h.pool, holder, "tally bench admission --budgets", time.Now())
		if err != nil {
			return fmt.Errorf("gateway token: %w", err)
		}
		h.holders, h.tokens = append(h.holders, holder), append(h.tokens, tok)
	}
	if h.o.draws("pool") {
		return h.call(ctx, http.MethodPut, "/v1/pools/"+h.pname, h.api.admin, map[string]any{"members": h.names}, nil)
	}
	return nil
}

func (h *hotRun) close(ctx context.Context) error {
	if h.api != nil {
		h.api.close(ctx)
	}
	if h.tr != nil {
		h.tr.CloseIdleConnections()
	}
	if h.spool != nil {
		h.spool.Close()
	}
	if h.pool != nil {
		h.pool.Close()
	}
	return nil
}

// rules puts an exact rule of limit on every budget drawn, for meter:
// customers' directly, the pool's and global through the REST API.
func (h *hotRun) rules(ctx context.Context, meter string, limit decimal.Decimal) error {
	if h.o.draws("customer") {
		for _, c := range h.names {
			if _, err := quota.PutRuleDB(ctx, h.pool, quota.RuleInput{Customer: c, Meter: meter, Limit: limit,
				Admission: quota.Exact, Actor: "tally bench admission"}); err != nil {
				return fmt.Errorf("exact rule: %w", err)
			}
		}
	}
	body := map[string]any{"limit": limit, "admission": "exact", "actor": "tally bench admission"}
	if h.o.draws("pool") {
		if err := h.call(ctx, http.MethodPut, "/v1/pools/"+h.pname+"/quotas/"+meter, h.api.admin, body, nil); err != nil {
			return err
		}
	}
	if h.o.draws("global") {
		return h.call(ctx, http.MethodPut, "/v1/global/quotas/"+meter, h.api.admin, body, nil)
	}
	return nil
}

// budgets are the scopes holder i's requests draw on, in lock order.
func (h *hotRun) budgets(i int) []string {
	var bs []string
	if h.o.draws("customer") {
		bs = append(bs, quota.CustomerScope(h.names[i]))
	}
	if h.o.draws("global") {
		bs = append(bs, quota.Global)
	}
	if h.o.draws("pool") {
		bs = append(bs, quota.PoolScope(h.pname))
	}
	slices.Sort(bs)
	return bs
}

// errStatus is an answer of the API other than the one expected.
type errStatus struct {
	status int
	body   string
}

func (e *errStatus) Error() string { return fmt.Sprintf("HTTP %d: %s", e.status, e.body) }

// call sends a JSON request and decodes a 2xx answer into out (when not nil).
func (h *hotRun) call(ctx context.Context, method, path, token string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	if body == nil {
		b = nil
	}
	req, err := http.NewRequestWithContext(ctx, method, h.api.url+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if b != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return &errStatus{resp.StatusCode, strings.TrimSpace(string(data))}
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// takeREST asks for one unit as holder i's gateway would, and releases it
// spent: false when refused (409 budget-exhausted).
func (h *hotRun) takeREST(ctx context.Context, i int, meter string) (bool, time.Duration, error) {
	var g struct {
		ID string `json:"id"`
	}
	t0 := time.Now()
	err := h.call(ctx, http.MethodPost, "/v1/grants", h.tokens[i], map[string]any{"holder": h.holders[i], "generation": 1,
		"customer": h.names[i], "meter": meter, "amount": "1", "budgets": h.budgets(i)}, &g)
	took := time.Since(t0)
	if se, ok := errors.AsType[*errStatus](err); ok && se.status == http.StatusConflict && strings.Contains(se.body, "budget-exhausted") {
		return false, took, nil
	}
	if err != nil {
		return false, took, err
	}
	return true, took, h.call(ctx, http.MethodPost, "/v1/grants/"+g.ID+"/release", h.tokens[i],
		map[string]any{"holder": h.holders[i], "generation": 1, "spent": "1"}, nil)
}

// takeStore is takeREST without HTTP: the admission store in process.
func (h *hotRun) takeStore(ctx context.Context, i int, meter string) (bool, time.Duration, error) {
	t0 := time.Now()
	g, err := h.store.Issue(ctx, admission.IssueRequest{Holder: h.holders[i], Generation: 1, Customer: h.names[i],
		Meter: meter, Amount: decimal.NewFromInt(1), Budgets: h.budgets(i)})
	took := time.Since(t0)
	if _, ok := errors.AsType[*admission.BudgetExhaustedError](err); ok {
		return false, took, nil
	}
	if err != nil {
		return false, took, err
	}
	_, err = h.store.Release(ctx, admission.Report{Grant: g.ID, Holder: h.holders[i], Generation: 1, Spent: decimal.NewFromInt(1)})
	return true, took, err
}

// takeFunc takes one unit for holder i: whether it was granted and how
// long the grant request took (the release after it not included).
type takeFunc func(ctx context.Context, i int) (ok bool, took time.Duration, err error)

// takeIssue is takeStore without the release: the grant stays live.
func (h *hotRun) takeIssue(ctx context.Context, i int, meter string) (bool, time.Duration, error) {
	t0 := time.Now()
	_, err := h.store.Issue(ctx, admission.IssueRequest{Holder: h.holders[i], Generation: 1, Customer: h.names[i],
		Meter: meter, Amount: decimal.NewFromInt(1), Budgets: h.budgets(i)})
	took := time.Since(t0)
	if _, ok := errors.AsType[*admission.BudgetExhaustedError](err); ok {
		return false, took, nil
	}
	return err == nil, took, err
}

// measure runs take in a loop on every holder for Duration.
func (h *hotRun) measure(ctx context.Context, name string, take takeFunc) HotRow {
	row := HotRow{Name: name}
	var grants, refused, errs atomic.Int64
	var firstErr error
	var once sync.Once
	lat := make([][]time.Duration, h.o.Holders)
	start := time.Now()
	deadline := start.Add(h.o.Duration)
	var wg sync.WaitGroup
	for i := range h.o.Holders {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(deadline) {
				ok, took, err := take(ctx, i)
				lat[i] = append(lat[i], took)
				switch {
				case err != nil:
					errs.Add(1)
					once.Do(func() { firstErr = err })
				case ok:
					grants.Add(1)
				default:
					refused.Add(1)
				}
			}
		})
	}
	wg.Wait()
	row.Elapsed = time.Since(start)
	row.Grants, row.Refused, row.Errors = grants.Load(), refused.Load(), errs.Load()
	all := slices.Concat(lat...)
	slices.Sort(all)
	row.P50, row.P99 = pct(all, 0.50), pct(all, 0.99)
	if row.Errors > 0 {
		row.Problems = append(row.Problems, fmt.Sprintf("%d requests failed, the first: %v", row.Errors, firstErr))
	}
	if row.Refused > 0 {
		row.Problems = append(row.Problems, fmt.Sprintf("%d requests refused with every limit out of reach", row.Refused))
	}
	return row
}

// readBudgets reads meter's budgets back as a user would: every
// customer's (GET /v1/customers/{c}/budgets) and the pool's (GET
// /v1/pools/{name}) through the REST API, the global one from the store
// (the API has no GET for it). Only the budgets drawn are read.
func (h *hotRun) readBudgets(ctx context.Context, meter string) ([]BudgetState, []decimal.Decimal, error) {
	var states []BudgetState
	var limits []decimal.Decimal
	add := func(name string, found bool, consumed, live, limit decimal.Decimal) error {
		if !found {
			return fmt.Errorf("%s has no budget for %s", name, meter)
		}
		states, limits = append(states, BudgetState{Budget: name, Consumed: consumed, Live: live}), append(limits, limit)
		return nil
	}
	if h.o.draws("customer") {
		for _, c := range h.names {
			var page struct{ Items []admission.Budget }
			if err := h.call(ctx, http.MethodGet, "/v1/customers/"+c+"/budgets", h.api.admin, nil, &page); err != nil {
				return nil, nil, err
			}
			i := slices.IndexFunc(page.Items, func(b admission.Budget) bool { return b.Meter == meter }) // newest period first
			var b admission.Budget
			if i >= 0 {
				b = page.Items[i]
			}
			if err := add(quota.CustomerScope(c), i >= 0, b.Consumed, b.Live, b.Limit); err != nil {
				return nil, nil, err
			}
		}
	}
	scope := func(name string, bs []admission.ScopeBudget) error {
		i := slices.IndexFunc(bs, func(b admission.ScopeBudget) bool { return b.Meter == meter })
		var b admission.ScopeBudget
		if i >= 0 {
			b = bs[i]
		}
		return add(name, i >= 0, b.Consumed, b.Live, b.Limit)
	}
	if h.o.draws("pool") {
		var v struct{ Budgets []admission.ScopeBudget }
		if err := h.call(ctx, http.MethodGet, "/v1/pools/"+h.pname, h.api.admin, nil, &v); err != nil {
			return nil, nil, err
		}
		if err := scope(quota.PoolScope(h.pname), v.Budgets); err != nil {
			return nil, nil, err
		}
	}
	if h.o.draws("global") {
		bs, err := h.store.ScopeBudgets(ctx, quota.Global)
		if err != nil {
			return nil, nil, err
		}
		if err := scope(quota.Global, bs); err != nil {
			return nil, nil, err
		}
	}
	return states, limits, nil
}

// check reads meter's budgets after a measured row: the customers'
// consumed add up to the grants of 1 taken, and so do the pool's and the
// global one; nothing is live when every grant was released (its unit
// spent), all of it when none was; no budget is over its limit.
func (h *hotRun) check(ctx context.Context, meter string, grants int64, released bool) ([]string, error) {
	states, limits, err := h.readBudgets(ctx, meter)
	if err != nil {
		return nil, err
	}
	var problems []string
	n := decimal.NewFromInt(grants)
	var customers decimal.Decimal
	for i, s := range states {
		if s.Consumed.GreaterThan(limits[i]) {
			problems = append(problems, fmt.Sprintf("%s: consumed %s over its limit %s", s.Budget, s.Consumed, limits[i]))
		}
		if released && !s.Live.IsZero() {
			problems = append(problems, fmt.Sprintf("%s: %s live after every grant was released", s.Budget, s.Live))
		}
		if !released && !s.Live.Equal(s.Consumed) {
			problems = append(problems, fmt.Sprintf("%s: %s live of %s consumed, no grant released", s.Budget, s.Live, s.Consumed))
		}
		if strings.HasPrefix(s.Budget, "customer:") {
			customers = customers.Add(s.Consumed)
		} else if !s.Consumed.Equal(n) {
			problems = append(problems, fmt.Sprintf("%s: consumed %s, %d grants of 1 taken", s.Budget, s.Consumed, grants))
		}
	}
	if h.o.draws("customer") && !customers.Equal(n) {
		problems = append(problems, fmt.Sprintf("customers: consumed %s together, %d grants of 1 taken", customers, grants))
	}
	return problems, nil
}

// counter is the baseline: a central counter in Postgres, one statement
// per request that locks the request's budget rows in key order, checks
// every one and adds to all (all or nothing), a connection per holder.
func (h *hotRun) counter(ctx context.Context) (HotRow, error) {
	pool, err := newPool(ctx, h.o.DatabaseURL, h.o.Holders)
	if err != nil {
		return HotRow{}, err
	}
	defer pool.Close()
	var keys []string
	for i := range h.o.Holders {
		for _, k := range h.budgets(i) {
			if !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	}
	for _, q := range []string{qHotTable, qHotClear} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return HotRow{}, fmt.Errorf("counter table: %w", err)
		}
	}
	if _, err := pool.Exec(ctx, qHotFill, pgx.NamedArgs{"keys": keys, "limit": hotLimit.IntPart()}); err != nil {
		return HotRow{}, fmt.Errorf("counter table: %w", err)
	}
	row := h.measure(ctx, "central counter, Postgres (one UPDATE … RETURNING)", func(ctx context.Context, i int) (bool, time.Duration, error) {
		bs := h.budgets(i)
		t0 := time.Now()
		rows, err := pool.Query(ctx, qHotTake, pgx.NamedArgs{"keys": bs, "cost": 1})
		if err != nil {
			return false, time.Since(t0), err
		}
		n, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		took := time.Since(t0)
		return len(n) == len(bs), took, err
	})
	rows, err := pool.Query(ctx, qHotUsed)
	if err != nil {
		return row, err
	}
	type ku struct {
		Key  string
		Used int64
	}
	used, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ku])
	if err != nil {
		return row, err
	}
	var customers int64
	for _, u := range used {
		if strings.HasPrefix(u.Key, "customer:") {
			customers += u.Used
		} else if u.Used != row.Grants {
			row.Problems = append(row.Problems, fmt.Sprintf("%s: counted %d, %d taken", u.Key, u.Used, row.Grants))
		}
	}
	if h.o.draws("customer") && customers != row.Grants {
		row.Problems = append(row.Problems, fmt.Sprintf("customers: counted %d together, %d taken", customers, row.Grants))
	}
	return row, nil
}

// refusal makes the global budget of meter tight (its limit set to what
// it has consumed), has every holder ask for one unit at once through the
// REST API, and checks that each was refused by global and that no budget
// moved: a refusal takes nothing (docs/design.md §13).
func (h *hotRun) refusal(ctx context.Context, meter string) (HotRefusal, error) {
	var r HotRefusal
	before, _, err := h.readBudgets(ctx, meter)
	if err != nil {
		return r, err
	}
	r.Before = before
	global := before[len(before)-1] // read last
	if err := h.call(ctx, http.MethodPut, "/v1/global/quotas/"+meter, h.api.admin, map[string]any{"limit": global.Consumed,
		"admission": "exact", "actor": "tally bench admission", "reason": "refusal phase: global tight"}, nil); err != nil {
		return r, err
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range h.o.Holders {
		wg.Go(func() {
			err := h.call(ctx, http.MethodPost, "/v1/grants", h.tokens[i], map[string]any{"holder": h.holders[i], "generation": 1,
				"customer": h.names[i], "meter": meter, "amount": "1", "budgets": h.budgets(i)}, nil)
			mu.Lock()
			defer mu.Unlock()
			r.Requests++
			var p struct{ Type, Binding string }
			se, ok := errors.AsType[*errStatus](err)
			switch {
			case err == nil:
				r.Problems = append(r.Problems, fmt.Sprintf("%s: granted with the global budget exhausted", h.names[i]))
			case !ok || se.status != http.StatusConflict || json.Unmarshal([]byte(se.body), &p) != nil:
				r.Problems = append(r.Problems, fmt.Sprintf("%s: %v", h.names[i], err))
			case p.Binding != quota.Global+"/"+meter:
				r.Problems = append(r.Problems, fmt.Sprintf("%s: refused by %q, not the global budget", h.names[i], p.Binding))
			default:
				r.Refused++
			}
		})
	}
	wg.Wait()
	if r.After, _, err = h.readBudgets(ctx, meter); err != nil {
		return r, err
	}
	for i, b := range r.Before {
		a := r.After[i]
		if !a.Consumed.Equal(b.Consumed) || !a.Live.Equal(b.Live) {
			r.Problems = append(r.Problems, fmt.Sprintf("%s: consumed %s live %s before the refusals, %s and %s after",
				b.Budget, b.Consumed, b.Live, a.Consumed, a.Live))
		}
	}
	return r, nil
}
