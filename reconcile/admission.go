package reconcile

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admission"
)

// Findings of exact admission, per exact budget and period.
const (
	// KindOverGranted: a grant took the budget's consumed above the limit
	// of the rule version in force when it was issued (docs/design.md
	// §12's one definition, not the limit admission chose). Grants are
	// issued only within that limit, so this must never happen.
	KindOverGranted = "over_granted"
	// KindUngrantedUsage: billed usage above what grants and bypasses
	// allowed: overshoot that escaped the protocol (notice, with amount).
	KindUngrantedUsage = "ungranted_usage"
	// KindStranded: granted but never spent (notice).
	KindStranded = "stranded"
	// KindBypass: admitted without a grant while Tally was unreachable
	// (notice, amounts per holder).
	KindBypass = "bypass"

	CheckAdmission = "exact_admission"
)

// checkAdmission compares each exact budget's grants with billed usage.
func (r *runner) checkAdmission(ctx context.Context, tx pgx.Tx, tg target, now time.Time) error {
	accounts, err := admission.Accounts(ctx, tx, tg.customers, tg.starts, now)
	if err != nil {
		return err
	}
	for _, a := range accounts {
		// A budget's billed usage is its meter's rollups in the target's
		// period, which the rollup check summed for every target in one
		// statement (Accounts returns the budgets of the targets' periods
		// only): no statement per budget.
		used := r.rollups[[2]string{a.Customer, a.Meter}]
		if over := a.OverGranted; over.IsPositive() {
			r.find(Finding{Kind: KindOverGranted, Severity: Discrepancy, Customer: a.Customer, Meter: a.Meter, Amount: &over,
				Detail: fmt.Sprintf("grants took the budget %s above the limit of the rule version in force when they were issued (limit now %s, %s spent)",
					over, a.Limit, a.Spent)})
		}
		bypassed := decimal.Zero
		holders := make([]string, 0, len(a.Bypassed))
		for h, v := range a.Bypassed {
			bypassed = bypassed.Add(v)
			holders = append(holders, h)
		}
		sort.Strings(holders)
		// Unreleased grants may have been spent up to their amount, so
		// consumed (not the reported spent) is what grants allowed.
		if escaped := used.Sub(a.Consumed).Sub(bypassed); escaped.IsPositive() {
			r.find(Finding{Kind: KindUngrantedUsage, Severity: Notice, Customer: a.Customer, Meter: a.Meter, Amount: &escaped,
				Detail: fmt.Sprintf("%s billed, grants allowed %s and bypasses %s", used, a.Consumed, bypassed)})
		}
		if a.Stranded.IsPositive() {
			s := a.Stranded
			r.find(Finding{Kind: KindStranded, Severity: Notice, Customer: a.Customer, Meter: a.Meter, Amount: &s,
				Detail: fmt.Sprintf("%s granted and never spent (limit %s)", s, a.Limit)})
		}
		if bypassed.IsPositive() {
			parts := make([]string, len(holders))
			for i, h := range holders {
				parts[i] = h + " " + a.Bypassed[h].String()
			}
			r.find(Finding{Kind: KindBypass, Severity: Notice, Customer: a.Customer, Meter: a.Meter, Amount: &bypassed,
				Detail: "admitted without a grant while Tally was unreachable: " + strings.Join(parts, ", ")})
		}
	}
	return r.checkScopeBudgets(ctx, tx, tg, now)
}

// checkScopeBudgets reconciles the pool and global budgets that the
// targets' grants drew from: over_granted and stranded, per budget, its
// scope in the detail (a finding of no one customer). Usage is compared
// per customer budget only: a pool's members change over a period.
func (r *runner) checkScopeBudgets(ctx context.Context, tx pgx.Tx, tg target, now time.Time) error {
	accounts, err := admission.ScopeAccounts(ctx, tx, tg.customers, tg.starts, now)
	if err != nil {
		return err
	}
	for _, a := range accounts {
		period := a.PeriodStart
		budget := a.Scope + "/" + a.Meter
		if over := a.OverGranted; over.IsPositive() {
			r.find(Finding{Kind: KindOverGranted, Severity: Discrepancy, Meter: a.Meter, Period: &period, Amount: &over,
				Detail: fmt.Sprintf("%s: grants took the budget %s above the limit of the rule version in force when they were issued (limit now %s, %s spent)",
					budget, over, a.Limit, a.Spent)})
		}
		if a.Stranded.IsPositive() {
			s := a.Stranded
			r.find(Finding{Kind: KindStranded, Severity: Notice, Meter: a.Meter, Period: &period, Amount: &s,
				Detail: fmt.Sprintf("%s: %s granted and never spent (limit %s)", budget, s, a.Limit)})
		}
	}
	return r.checkRateBudgets(ctx, tx, tg, now)
}
