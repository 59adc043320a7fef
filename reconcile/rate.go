package reconcile

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/admission"
)

// KindRateUnbalanced: a rate budget's bucket was given back more than its
// released grants left unspent (docs/design.md §17): tokens appeared. Must
// never happen.
const KindRateUnbalanced = "rate_unbalanced"

// checkRateBudgets reconciles the rate budgets the targets' grants drew
// from: stranded (notice, with the refusals in the detail) and
// rate_unbalanced (discrepancy), per bucket, its scope in the detail.
func (r *runner) checkRateBudgets(ctx context.Context, tx pgx.Tx, tg target, now time.Time) error {
	accounts, err := admission.RateAccounts(ctx, tx, tg.customers, tg.starts, now)
	if err != nil {
		return err
	}
	for _, a := range accounts {
		budget := a.Scope + "/" + a.Meter
		if u := a.Unbalanced; u.IsPositive() {
			r.find(Finding{Kind: KindRateUnbalanced, Severity: Discrepancy, Meter: a.Meter, Amount: &u,
				Detail: fmt.Sprintf("%s (rate): releases gave back %s more than their grants left unspent", budget, u)})
		}
		if a.Stranded.IsPositive() {
			s := a.Stranded
			r.find(Finding{Kind: KindStranded, Severity: Notice, Meter: a.Meter, Amount: &s,
				Detail: fmt.Sprintf("%s (rate): %s granted and never spent; %d requests refused by the bucket", budget, s, a.Refused)})
		}
	}
	return nil
}
