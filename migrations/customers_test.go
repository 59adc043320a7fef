package migrations_test

import (
	"context"
	"strings"
	"testing"

	"github.com/tally-ledger/tally/migrations"
	"github.com/tally-ledger/tally/periods"
)

// TestReferredCustomersBackfill: migration 00017 creates, with the default
// calendar, every customer that something refers to but that has no
// customers row (a rule, a token, a pool membership, a budget, from before
// customers were created on reference), and leaves existing ones alone.
func TestReferredCustomersBackfill(t *testing.T) {
	ctx := context.Background()
	pool := poolAt(t, 16)
	for _, sql := range []string{
		`INSERT INTO customers (id, schedule) VALUES ('metered', '[
		  {"effective_from":"0001-01-01T00:00:00Z","calendar":{"cadence":"weekly","anchor_day":1,"anchor_time":"00:00","zone":"UTC"}}]')`,
		`INSERT INTO quota_rules (customer, meter, version, effective_at, "limit", warn_at, mode, on_stale, stale_after, created_at, actor)
		 VALUES ('ruled', 'calls', 1, now(), 10, 0.8, 'enforce', 'allow', '5 minutes', now(), 'admin'),
		        ('metered', 'calls', 1, now(), 10, 0.8, 'enforce', 'allow', '5 minutes', now(), 'admin')`,
		`INSERT INTO api_tokens (id, customer, token_hash, created_at) VALUES (gen_random_uuid(), 'tokened', sha256('x'), now())`,
		`INSERT INTO api_tokens (id, gateway, token_hash, created_at) VALUES (gen_random_uuid(), 'gw', sha256('y'), now())`,
		`INSERT INTO pools (name, created_at, updated_at) VALUES ('free', now(), now())`,
		`INSERT INTO pool_members (pool, customer, joined_at, actor) VALUES ('free', 'pooled', now(), 'admin')`,
		`INSERT INTO admission_budgets (customer, meter, period_start, period_end, period, rule_version, updated_at)
		 VALUES ('granted', 'calls', '2026-11-01', '2026-12-01', '2026-11-01', -1, now())`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if err := migrations.UpTo(ctx, pool, 17); err != nil {
		t.Fatal(err)
	}
	var got []string
	rows, err := pool.Query(ctx, `SELECT id FROM customers ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		got = append(got, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, " ") != "granted metered pooled ruled tokened" {
		t.Fatalf("customers after 00017: %v", got)
	}
	for _, id := range []string{"granted", "pooled", "ruled", "tokened"} {
		c, err := periods.Store{}.Customer(ctx, pool, id)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Schedule) != 1 || c.Schedule[0].Calendar != periods.DefaultCalendar() || !c.Schedule[0].EffectiveFrom.IsZero() {
			t.Fatalf("%s: schedule %+v, want the default calendar from the beginning", id, c.Schedule)
		}
	}
	c, err := periods.Store{}.Customer(ctx, pool, "metered")
	if err != nil || c.Schedule[0].Calendar.Cadence != periods.Weekly {
		t.Fatalf("an existing customer's calendar changed: %+v %v", c.Schedule, err)
	}
}
