package console

import (
	"errors"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/quota"
	"github.com/tally-ledger/tally/reconcile"
)

// refresh reads ?refresh=N (5 to 300 seconds) for pages that offer
// reloading themselves.
func refresh(r *http.Request) int {
	n, err := strconv.Atoi(r.URL.Query().Get("refresh"))
	if err != nil || n < 5 || n > 300 {
		return 0
	}
	return n
}

func requireAdmin(r *http.Request) error {
	if !requestFrom(r.Context()).Admin {
		return errAdminOnly
	}
	return nil
}

// overviewView is the admin's front page.
type overviewView struct {
	Topic          string
	Partitions     []ingest.PartitionStatus
	PendingDead    int64
	LastRuns       []reconcile.Summary
	Leader         *quota.Lease
	Customers      []string
	CustomersMore  bool
	RefreshSeconds int
}

const overviewCustomer = 50

// sentHome sends a customer from an admin's list page to its own page,
// and says whether it did.
func sentHome(w http.ResponseWriter, r *http.Request) bool {
	v := requestFrom(r.Context())
	if !v.Admin {
		http.Redirect(w, r, customerPath(v.Customer), http.StatusSeeOther)
	}
	return !v.Admin
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	if sentHome(w, r) {
		return nil
	}
	ov := overviewView{Topic: c.topic, RefreshSeconds: refresh(r)}
	var err error
	if ov.Partitions, err = ingest.Status(ctx, c.pool, c.topic); err != nil {
		return err
	}
	if ov.PendingDead, err = ingest.PendingDeadLetters(ctx, c.pool); err != nil {
		return err
	}
	runs, err := reconcile.List(ctx, c.pool, "", uuid.Nil, 200)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, run := range runs { // newest first: the first of each period is its last
		if !seen[run.Period] {
			seen[run.Period] = true
			ov.LastRuns = append(ov.LastRuns, run)
		}
	}
	if ov.Leader, err = quota.Leader(ctx, c.pool, ""); err != nil {
		return err
	}
	ids, err := periods.CustomerIDs(ctx, c.pool, "", overviewCustomer+1)
	if err != nil {
		return err
	}
	ov.Customers, ov.CustomersMore = ids[:min(len(ids), overviewCustomer)], len(ids) > overviewCustomer
	c.render(w, r, http.StatusOK, "overview", page{Title: "Overview", Nav: "overview", Refresh: ov.RefreshSeconds, Body: ov})
	return nil
}

type customersView struct {
	Customers []string
	Next      string
}

const customersPage = 200

// ruleVersionsShown is how many versions of each quota's rule the
// customer page shows, the latest: a rule changed every day has
// thousands.
const ruleVersionsShown = 20

// budgetsShown is how many exact budgets the customer page shows, the
// latest: a budget is kept for every period an exact rule was in force.
const budgetsShown = 24

func (c *Console) customers(w http.ResponseWriter, r *http.Request) error {
	if sentHome(w, r) {
		return nil
	}
	ids, err := periods.CustomerIDs(r.Context(), c.pool, r.URL.Query().Get("after"), customersPage+1)
	if err != nil {
		return err
	}
	cv := customersView{Customers: ids[:min(len(ids), customersPage)]}
	if len(ids) > customersPage {
		cv.Next = cv.Customers[len(cv.Customers)-1]
	}
	c.render(w, r, http.StatusOK, "customers", page{Title: "Customers", Nav: "customers", Body: cv})
	return nil
}

// customerView is one customer's page.
type customerView struct {
	Customer       string
	Zone           *time.Location
	Period         periods.Period
	State          periods.State
	Usage          api.Usage
	Charts         []chart
	KindCharts     []kindChart // gauges and unique meters
	Empty          bool        // no usage and no quota in the period
	Quotas         []quota.MeterStatus
	History        map[string][]quota.Rule // the latest ruleVersionsShown versions of each quota's rule, newest first
	Periods        []periods.Summary
	Grants         []admission.Grant
	Budgets        []admission.Budget     // the latest budgetsShown, newest period first
	MoreBudgets    bool                   // older budgets than those
	RateBudgets    []admission.RateBudget // its own, its pools' and global (docs/design.md §17)
	RefreshSeconds int
	Ref            string
}

// readable is the path's {customer} when the viewer may read it; another
// customer's is the same not-found as an unknown one.
func readable(r *http.Request) (string, error) {
	customer := chi.URLParam(r, "customer")
	if !requestFrom(r.Context()).canRead(customer) {
		return "", notFoundError{what: "customer " + echo(customer)}
	}
	return customer, nil
}

// readCustomer is the path's customer and its calendar, when the viewer
// may read it.
func (c *Console) readCustomer(r *http.Request) (periods.Customer, error) {
	customer, err := readable(r)
	if err != nil {
		return periods.Customer{}, err
	}
	cust, err := c.periodStore().Customer(r.Context(), c.pool, customer)
	if errors.Is(err, periods.ErrUnknownCustomer) {
		return periods.Customer{}, notFoundError{what: "customer " + echo(customer)}
	}
	return cust, err
}

func (c *Console) customer(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	cust, err := c.readCustomer(r)
	if err != nil {
		return err
	}
	customer, store := cust.ID, c.periodStore()
	now := c.now()
	ref := r.URL.Query().Get("period")
	if ref == "" {
		ref = "current"
	}
	p, err := cust.Schedule.Resolve(ref, now)
	if err != nil {
		return err
	}
	cv := customerView{Customer: customer, Zone: p.Start.Location(), Period: p, RefreshSeconds: refresh(r), Ref: ref}
	if cv.Usage, err = c.api.Usage(ctx, customer, p.Name); err != nil {
		return err
	}
	cv.State = cv.Usage.State
	if cv.Quotas, err = quota.StatusWith(ctx, c.pool, customer, quota.StatusOptions{Now: now, IngestTopic: c.topic}); err != nil {
		return err
	}
	limits := periodLimits(cv.Quotas, p)
	meters := make([]string, 0, len(limits))
	for m := range limits {
		meters = append(meters, m)
	}
	kinds, err := ledger.MeterKinds(ctx, c.pool, meters)
	if err != nil {
		return err
	}
	cv.Charts = charts(cv.Usage, cv.Quotas, kinds, p, now)
	cv.KindCharts = kindCharts(cv.Usage.Gauges, cv.Usage.Uniques, limits, p.Start, p.End, now)
	cv.Empty = len(cv.Charts) == 0 && len(cv.KindCharts) == 0 && len(limits) == 0
	cv.History = map[string][]quota.Rule{}
	for _, q := range cv.Quotas {
		h, err := quota.LatestRuleVersions(ctx, c.pool, customer, q.Meter, ruleVersionsShown)
		if err != nil {
			return err
		}
		cv.History[q.Meter] = h
	}
	if cv.Periods, err = store.List(ctx, c.pool, customer); err != nil {
		return err
	}
	adm, err := admission.New(c.pool, admission.Config{Now: c.now, Logger: c.log})
	if err != nil {
		return err
	}
	if cv.Grants, err = adm.Grants(ctx, admission.ListRequest{Customer: customer, State: "live", Limit: 50}); err != nil {
		return err
	}
	if cv.Budgets, err = adm.BudgetsPage(ctx, admission.BudgetsRequest{Customer: customer, Limit: budgetsShown + 1}); err != nil {
		return err
	}
	if len(cv.Budgets) > budgetsShown {
		cv.Budgets, cv.MoreBudgets = cv.Budgets[:budgetsShown], true
	}
	if cv.RateBudgets, err = adm.RateBudgetsOf(ctx, customer); err != nil {
		return err
	}
	c.render(w, r, http.StatusOK, "customer", page{Title: customer, Nav: "customers", Refresh: cv.RefreshSeconds, Body: cv})
	return nil
}

// charts is one chart per meter with usage or a quota this period.
// periodLimits are the limits of the quotas in quotas about period p.
func periodLimits(quotas []quota.MeterStatus, p periods.Period) map[string]decimal.NullDecimal {
	out := map[string]decimal.NullDecimal{}
	for _, q := range quotas {
		if q.Period == p.Name {
			out[q.Meter] = q.Rule.Limit
		}
	}
	return out
}

// charts are the counters' charts: each counter with usage in p, and each
// counter with a quota about p (kinds names the quotas' meters' kinds; a
// gauge's or unique meter's quota is its kind chart's, see kindCharts).
func charts(u api.Usage, quotas []quota.MeterStatus, kinds map[string]ledger.MeterKind, p periods.Period, now time.Time) []chart {
	byMeter := map[string]api.MeterUsage{}
	var meters []string
	for _, m := range u.Meters {
		byMeter[m.Meter] = m
		meters = append(meters, m.Meter)
	}
	// A quota's status is about the current period: its line is drawn on
	// that period's chart only.
	rules := map[string]quota.Rule{}
	for _, q := range quotas {
		if q.Period != p.Name || kinds[q.Meter] != ledger.Counter {
			continue
		}
		rules[q.Meter] = q.Rule
		if _, ok := byMeter[q.Meter]; !ok {
			meters = append(meters, q.Meter)
		}
	}
	sort.Strings(meters)
	var out []chart
	for _, m := range meters {
		var limit decimal.NullDecimal
		warn := decimal.Zero
		if rl, ok := rules[m]; ok {
			limit, warn = rl.Limit, rl.WarnAt
		}
		out = append(out, newChart(m, byMeter[m], p.Start, p.End, p.Start.Location(), limit, warn, now))
	}
	return out
}

func (c *Console) periodStore() periods.Store {
	return periods.Store{Grace: c.grace, Clock: c.now, Gate: reconcile.Gate, Kinds: ledger.StatementKinds}
}

type statementView struct {
	Customer  string
	Zone      *time.Location
	Statement periods.Statement
}

func (c *Console) statement(w http.ResponseWriter, r *http.Request) error {
	cust, err := c.readCustomer(r)
	if err != nil {
		return err
	}
	customer := cust.ID
	st, err := c.periodStore().Statement(r.Context(), c.pool, customer, chi.URLParam(r, "period"))
	if err != nil {
		return err
	}
	zone, err := cust.Schedule.CalendarAt(st.Start).Location()
	if err != nil {
		return err
	}
	c.render(w, r, http.StatusOK, "statement", page{Title: customer + " " + st.Period, Nav: "customers",
		Body: statementView{Customer: customer, Zone: zone, Statement: st}})
	return nil
}

type reconciliationsView struct {
	Runs []reconcile.Summary
	Next string
}

const runsPage = 50

func (c *Console) reconciliations(w http.ResponseWriter, r *http.Request) error {
	if err := requireAdmin(r); err != nil {
		return err
	}
	var after uuid.UUID
	if s := r.URL.Query().Get("before"); s != "" {
		id, err := uuid.Parse(s)
		if err != nil {
			return notFoundError{what: "reconciliation page"}
		}
		after = id
	}
	runs, err := reconcile.List(r.Context(), c.pool, "", after, runsPage+1)
	if err != nil {
		return err
	}
	v := reconciliationsView{Runs: runs[:min(len(runs), runsPage)]}
	if len(runs) > runsPage {
		v.Next = v.Runs[len(v.Runs)-1].ID.String()
	}
	c.render(w, r, http.StatusOK, "reconciliations", page{Title: "Reconciliations", Nav: "reconciliations", Body: v})
	return nil
}

// findingGroup is the findings of one kind and severity, with their
// amounts added up.
type findingGroup struct {
	Kind, Severity string
	Count          int
	Amount         decimal.Decimal
	HasAmount      bool
	// Partial: the run did not list every finding of the group (a summary
	// finding counts the rest), so Amount is of those listed only.
	Partial bool
}

type reconciliationView struct {
	Run    *reconcile.Run
	Groups []findingGroup
}

func (c *Console) reconciliation(w http.ResponseWriter, r *http.Request) error {
	if err := requireAdmin(r); err != nil {
		return err
	}
	id, err := uuid.Parse(chi.URLParam(r, "id"))
	if err != nil {
		return notFoundError{what: "reconciliation run"}
	}
	run, err := reconcile.Get(r.Context(), c.pool, id)
	if err != nil {
		return err
	}
	idx := map[[2]string]int{}
	var groups []findingGroup
	for _, f := range run.Findings {
		k := [2]string{f.Severity, f.Kind}
		i, ok := idx[k]
		if !ok {
			i = len(groups)
			idx[k] = i
			groups = append(groups, findingGroup{Kind: f.Kind, Severity: f.Severity})
		}
		if f.Omitted > 0 {
			groups[i].Count += f.Omitted
			groups[i].Partial = true
		} else {
			groups[i].Count++
		}
		if f.Amount != nil {
			groups[i].Amount, groups[i].HasAmount = groups[i].Amount.Add(*f.Amount), true
		}
	}
	sort.Slice(groups, func(i, j int) bool {
		if groups[i].Severity != groups[j].Severity {
			return groups[i].Severity < groups[j].Severity // discrepancy before notice
		}
		return groups[i].Kind < groups[j].Kind
	})
	c.render(w, r, http.StatusOK, "reconciliation", page{Title: "Reconciliation " + run.Period, Nav: "reconciliations",
		Body: reconciliationView{Run: run, Groups: groups}})
	return nil
}

type deadLettersView struct {
	Items []ingest.DeadLetter
	All   bool
	Next  string
}

const deadPage = 50

func (c *Console) deadLetters(w http.ResponseWriter, r *http.Request) error {
	if err := requireAdmin(r); err != nil {
		return err
	}
	q := r.URL.Query()
	f := ingest.DeadLetterFilter{Pending: q.Get("all") != "1", Limit: deadPage + 1}
	if s := q.Get("after"); s != "" {
		id, err := uuid.Parse(s)
		if err != nil {
			return notFoundError{what: "dead-letter page"}
		}
		f.After = id
	}
	items, err := ingest.ListDeadLetters(r.Context(), c.pool, f)
	if err != nil {
		return err
	}
	v := deadLettersView{Items: items[:min(len(items), deadPage)], All: !f.Pending}
	if len(items) > deadPage {
		v.Next = v.Items[len(v.Items)-1].ID.String()
	}
	c.render(w, r, http.StatusOK, "dead-letters", page{Title: "Dead letters", Nav: "dead-letters", Body: v})
	return nil
}

type deadLetterView struct {
	D      ingest.DeadLetter
	Result *ingest.ReplayResult
}

func (c *Console) deadLetterByPath(r *http.Request) (uuid.UUID, error) {
	if err := requireAdmin(r); err != nil {
		return uuid.Nil, err
	}
	id, err := uuid.Parse(chi.URLParam(r, "id"))
	if err != nil {
		return uuid.Nil, notFoundError{what: "dead letter"}
	}
	return id, nil
}

func (c *Console) deadLetter(w http.ResponseWriter, r *http.Request) error {
	id, err := c.deadLetterByPath(r)
	if err != nil {
		return err
	}
	d, err := ingest.GetDeadLetter(r.Context(), c.pool, id)
	if err != nil {
		return err
	}
	c.render(w, r, http.StatusOK, "dead-letter", page{Title: "Dead letter", Nav: "dead-letters", Body: deadLetterView{D: d}})
	return nil
}

// replay replays a dead letter after the admin confirmed it (the form's
// checkbox); the CSRF token was checked by authenticate.
func (c *Console) replay(w http.ResponseWriter, r *http.Request) error {
	id, err := c.deadLetterByPath(r)
	if err != nil {
		return err
	}
	if r.PostFormValue("confirm") != "yes" {
		d, err := ingest.GetDeadLetter(r.Context(), c.pool, id)
		if err != nil {
			return err
		}
		c.render(w, r, http.StatusBadRequest, "dead-letter", page{Title: "Dead letter", Nav: "dead-letters",
			Body: deadLetterView{D: d, Result: &ingest.ReplayResult{Detail: "Tick the box to confirm the replay."}}})
		return nil
	}
	res, err := c.api.ReplayDeadLetter(r.Context(), id)
	if err != nil {
		c.metrics.replays.WithLabelValues("error").Inc()
		return err
	}
	outcome := "refused_again"
	if res.Replayed {
		outcome = "replayed"
	}
	c.metrics.replays.WithLabelValues(outcome).Inc()
	c.log.InfoContext(r.Context(), "console: dead letter replayed", "id", id, "replayed", res.Replayed, "detail", res.Detail)
	c.render(w, r, http.StatusOK, "dead-letter", page{Title: "Dead letter", Nav: "dead-letters",
		Body: deadLetterView{D: res.DeadLetter, Result: &res}})
	return nil
}
