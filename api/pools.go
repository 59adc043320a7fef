package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/pools"
	"github.com/tally-ledger/tally/quota"
)

// Pools and the global budget (docs/design.md §13), admin only.

type poolBody struct {
	Members     []string   `json:"members"`
	EffectiveAt *timeInput `json:"effective_at"`
	Actor       *string    `json:"actor"`
}

// poolView is a pool with its rules, budgets and usage this period.
type poolView struct {
	pools.Pool
	Rules   []quota.ScopeRule       `json:"rules"`
	Budgets []admission.ScopeBudget `json:"budgets"`
	// Usage is Σ of the members' metered usage (rollups) per meter in the
	// pool's current period (monthly, UTC), a member that left counted
	// until it left (qPoolUsage).
	Usage []poolUsage `json:"usage"`
}

type poolUsage struct {
	Meter       string          `json:"meter"`
	PeriodStart time.Time       `json:"period_start"`
	Used        decimal.Decimal `json:"used"`
}

// qPoolUsage sums the members' rollups per meter over the pool's period,
// as the enforcer counts a lagged pool rule's usage (docs/design.md §13,
// quota's qScopeUsageHead): every customer that was a member at some time
// of the period, from the period's start until it last left, or to the
// end while it is a member (joining brings the period's usage in, leaving
// takes nothing back, usage after leaving is no longer the pool's).
const qPoolUsage = `
WITH mem AS (
    SELECT m.customer, CASE WHEN bool_or(m.left_at IS NULL) THEN NULL ELSE max(m.left_at) END AS until
    FROM pool_members m
    WHERE m.pool = @pool AND (m.left_at IS NULL OR m.left_at > @start)
    GROUP BY m.customer
)
SELECT u.meter, sum(u.quantity)::text
FROM rollups u JOIN mem ON mem.customer = u.customer
WHERE u.bucket >= @start AND u.bucket < @end
  AND (mem.until IS NULL OR u.bucket < mem.until)
GROUP BY u.meter ORDER BY u.meter`

func actorOf(p *string) (string, error) {
	if p == nil {
		return "admin", nil
	}
	if *p == "" || utf8.RuneCountInString(*p) > 200 {
		return "", invalidField("actor", "1-200 characters, or leave it out for \"admin\"")
	}
	return *p, nil
}

// putPool sets a pool's members (creating the pool): 201 when created.
func (a *API) putPool(w http.ResponseWriter, r *http.Request) error {
	name := chi.URLParam(r, "name")
	if _, err := queryParams(r); err != nil {
		return err
	}
	var b poolBody
	if err := decodeJSON(r, &b); err != nil {
		return err
	}
	actor, err := actorOf(b.Actor)
	if err != nil {
		return err
	}
	if b.Members == nil {
		return invalidField("members", "is required (an empty list empties the pool)")
	}
	in := pools.PutInput{Name: name, Members: b.Members, Actor: actor}
	if in.EffectiveAt, err = b.EffectiveAt.instant("effective_at"); err != nil {
		return err
	}
	_, existed := pools.Get(r.Context(), a.pool, name)
	s, err := a.admissionStore()
	if err != nil {
		return err
	}
	if _, err := s.PutPool(r.Context(), in); err != nil {
		return poolsProblem(err)
	}
	v, err := a.poolView(r, name)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if errors.Is(existed, pools.ErrNotFound) {
		status = http.StatusCreated
		w.Header().Set("Location", "/v1/pools/"+name)
	}
	writeJSON(w, status, v)
	return nil
}

func (a *API) listPools(w http.ResponseWriter, r *http.Request) error {
	q, err := queryParams(r, "limit", "cursor")
	if err != nil {
		return err
	}
	ps, err := pools.List(r.Context(), a.pool)
	if err != nil {
		return err
	}
	page, err := pageInMemory(r, q, ps, func(p pools.Pool) []string { return []string{p.Name} }, nil)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

func (a *API) getPool(w http.ResponseWriter, r *http.Request) error {
	if _, err := queryParams(r); err != nil {
		return err
	}
	v, err := a.poolView(r, chi.URLParam(r, "name"))
	if err != nil {
		return poolsProblem(err)
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

func (a *API) poolView(r *http.Request, name string) (poolView, error) {
	ctx := r.Context()
	p, err := pools.Get(ctx, a.pool, name)
	if err != nil {
		return poolView{}, err
	}
	v := poolView{Pool: p}
	now := a.now()
	if v.Rules, err = quota.ScopeRules(ctx, a.pool, quota.PoolScope(name), now); err != nil {
		return poolView{}, err
	}
	s, err := a.admissionStore()
	if err != nil {
		return poolView{}, err
	}
	if v.Budgets, err = s.ScopeBudgets(ctx, quota.PoolScope(name)); err != nil {
		return poolView{}, err
	}
	period, err := admission.ScopePeriod(now)
	if err != nil {
		return poolView{}, err
	}
	rows, err := a.pool.Query(ctx, qPoolUsage, pgx.NamedArgs{"pool": name, "start": period.Start, "end": period.End})
	if err != nil {
		return poolView{}, err
	}
	v.Usage, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (poolUsage, error) {
		u := poolUsage{PeriodStart: period.Start.UTC()}
		var used string
		if err := row.Scan(&u.Meter, &used); err != nil {
			return u, err
		}
		u.Used, err = decimal.NewFromString(used)
		return u, err
	})
	if v.Rules == nil {
		v.Rules = []quota.ScopeRule{}
	}
	if v.Budgets == nil {
		v.Budgets = []admission.ScopeBudget{}
	}
	if v.Usage == nil {
		v.Usage = []poolUsage{}
	}
	return v, err
}

type scopeRuleBody struct {
	Limit *decimalInput `json:"limit"` // nil: absent or null
	// A rate rule (docs/design.md §17) instead of limit.
	Rate        json.RawMessage  `json:"rate"`
	MaxSkew     *durationInput   `json:"max_skew"`
	WarnAt      nullDecimalInput `json:"warn_at"`
	Mode        quota.Mode       `json:"mode"`
	Admission   quota.Admission  `json:"admission"`
	EffectiveAt *timeInput       `json:"effective_at"`
	Reason      string           `json:"reason"`
	Actor       *string          `json:"actor"`
}

// maxSkewRule is the range of a rate rule's max_skew (quota's).
var maxSkewRule = quota.MaxSkewRange

func (a *API) putPoolQuota(w http.ResponseWriter, r *http.Request) error {
	name := chi.URLParam(r, "name")
	if !quota.ValidPoolName(name) {
		return invalidField("name", "%s is not 1-128 characters of A-Z a-z 0-9 . _ -", quote(name))
	}
	if _, err := pools.Get(r.Context(), a.pool, name); err != nil {
		return poolsProblem(err)
	}
	return a.putScopeQuota(w, r, quota.PoolScope(name), "/v1/pools/"+name)
}

func (a *API) putGlobalQuota(w http.ResponseWriter, r *http.Request) error {
	return a.putScopeQuota(w, r, quota.Global, "")
}

// putScopeQuota stores a new version of a pool's or the global rule of a
// meter: 201 for its first version.
func (a *API) putScopeQuota(w http.ResponseWriter, r *http.Request, scope, location string) error {
	if _, err := queryParams(r); err != nil {
		return err
	}
	var b scopeRuleBody
	if err := decodeJSON(r, &b); err != nil {
		return err
	}
	actor, err := actorOf(b.Actor)
	if err != nil {
		return err
	}
	hasRate := len(b.Rate) > 0 && string(b.Rate) != "null" // null: left out
	if b.Limit == nil && !hasRate {
		// A missing limit is not a limit of 0: that would refuse every
		// member (a customer's rule is refused the same way).
		return invalid(FieldError{Field: "limit", Detail: "is required (or a rate)"})
	}
	in := quota.ScopeRuleInput{Scope: scope, Meter: chi.URLParam(r, "meter"), WarnAt: b.WarnAt.NullDecimal,
		Mode: b.Mode, Admission: b.Admission, Reason: b.Reason, Actor: actor}
	if b.Limit != nil {
		in.Limit = b.Limit.Decimal
	}
	if in.EffectiveAt, err = b.EffectiveAt.instant("effective_at"); err != nil {
		return err
	}
	if hasRate {
		var errs []error
		if in.Rate, errs = quota.DecodeRate(b.Rate); len(errs) > 0 {
			return invalid(fieldsOf(errors.Join(errs...))...)
		}
	}
	var bad *Problem
	if in.MaxSkew, bad = b.MaxSkew.given("max_skew", maxSkewRule); bad != nil {
		return besides(bad, in.Validate())
	}
	var rule quota.ScopeRule
	err = pgx.BeginFunc(r.Context(), a.pool, func(tx pgx.Tx) error {
		var err error
		rule, err = quota.PutScopeRuleClock(r.Context(), tx, in, a.now)
		return err
	})
	if err != nil {
		return err
	}
	status := http.StatusOK
	if rule.Version == 1 {
		status = http.StatusCreated
		if location != "" {
			w.Header().Set("Location", location)
		}
	}
	writeJSON(w, status, rule)
	return nil
}

// poolsProblem maps the pools package's errors to problems.
func poolsProblem(err error) error {
	var fields []FieldError
	var walk func(error)
	walk = func(e error) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, c := range j.Unwrap() {
				walk(c)
			}
		} else if fe, ok := e.(*pools.FieldError); ok {
			fields = append(fields, FieldError{Field: fe.Field, Detail: fe.Detail})
		}
	}
	walk(err)
	if len(fields) > 0 {
		return invalid(fields...)
	}
	return err
}
