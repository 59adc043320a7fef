package console

import (
	"encoding/json"
	"net/http"

	"github.com/tally-ledger/tally/alerts"
)

// alertsPage lists alert rules with each subject × threshold's state, and
// the recent events with their deliveries' attempts (docs/design.md §15).
type alertsPage struct {
	Rules  []alertRuleView
	Events []alertEventView
}

type alertRuleView struct {
	alerts.Rule
	States []alerts.SubjectState
}

type alertEventView struct {
	alerts.Event
	Deliveries []alerts.Delivery
}

const alertEventsShown = 50

func (c *Console) alerts(w http.ResponseWriter, r *http.Request) error {
	if err := requireAdmin(r); err != nil {
		return err
	}
	ctx := r.Context()
	rules, err := alerts.Rules(ctx, c.pool)
	if err != nil {
		return err
	}
	var v alertsPage
	for _, rule := range rules {
		st, err := alerts.Status(ctx, c.pool, rule, c.topic, c.now())
		if err != nil {
			return err
		}
		v.Rules = append(v.Rules, alertRuleView{Rule: rule, States: st})
	}
	evs, err := alerts.Events(ctx, c.pool, alerts.EventFilter{State: r.URL.Query().Get("state"), Limit: alertEventsShown})
	if err != nil {
		return err
	}
	for _, e := range evs {
		var ev alerts.Event
		if err := json.Unmarshal(e.Event, &ev); err != nil {
			return err
		}
		v.Events = append(v.Events, alertEventView{Event: ev, Deliveries: e.Deliveries})
	}
	c.render(w, r, http.StatusOK, "alerts", page{Title: "Alerts", Nav: "alerts", Refresh: 10, Body: v})
	return nil
}
