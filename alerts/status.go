package alerts

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/quota"
)

// SubjectState is one subject × threshold of a rule in the subject's
// current period.
type SubjectState struct {
	Subject   string           `json:"subject"`
	Threshold string           `json:"threshold"` // "percent:80", "value:1000"
	Period    string           `json:"period"`
	State     string           `json:"state"` // ok, triggered, or not_evaluated
	Note      string           `json:"note,omitempty"`
	Used      decimal.Decimal  `json:"used"`
	At        *decimal.Decimal `json:"at,omitempty"` // the usage the threshold stands for
	Limit     *decimal.Decimal `json:"limit,omitempty"`
	AsOf      *time.Time       `json:"as_of"`
	// Transitions this period, and when the last one was written.
	Transitions int        `json:"transitions"`
	ChangedAt   *time.Time `json:"changed_at,omitempty"`
}

// Status is every subject × threshold of rule r now: the stored state of
// the current period, the usage and the limit in force. A "customers"
// rule lists the customers with usage this period or a stored state.
func Status(ctx context.Context, db DBTX, r Rule, ingestTopic string, now time.Time) ([]SubjectState, error) {
	rules := map[string]Rule{r.Name: r}
	states, err := readStates(ctx, db, qStatesOfRule, pgx.NamedArgs{"since": now.AddDate(0, 0, -statesWindowDays), "rule": r.Name})
	if err != nil {
		return nil, err
	}
	p, err := planSubjects(ctx, db, rules, states)
	if err != nil {
		return nil, err
	}
	usage, err := quota.UsageOf(ctx, db, quota.UsageQuery{Now: now, IngestTopic: ingestTopic, Subjects: p.subjects})
	if err != nil {
		return nil, err
	}
	out := []SubjectState{}
	for _, sc := range p.byRule[r.Name] {
		u := usage[p.index[quota.Subject{Scope: sc, Meter: r.Meter}]]
		for _, th := range r.Thresholds {
			k := stateKey{rule: r.Name, subject: sc, threshold: th.Key(), periodStart: u.Period.Start.UTC()}
			s, stored := states[k]
			if r.Subject == SubjectCustomers && !stored && u.Used.IsZero() {
				continue
			}
			ss := SubjectState{Subject: sc, Threshold: th.Key(), Period: u.Period.Name, State: "ok", Used: u.Used,
				Limit: u.Limit, AsOf: u.AsOf}
			if at, ok := th.At(u.Limit); ok {
				ss.At = &at
			} else {
				ss.State, ss.Note = "not_evaluated", "no quota rule with a period limit is in force for this subject and meter"
			}
			if stored {
				ss.Transitions = s.transitions
				if s.state == Triggered {
					ss.State = Triggered
				}
				c := s.changedAt
				ss.ChangedAt = &c
			}
			out = append(out, ss)
		}
	}
	return out, nil
}
