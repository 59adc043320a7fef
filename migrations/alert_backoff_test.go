package migrations_test

import (
	"context"
	"testing"

	"github.com/tally-ledger/tally/migrations"
)

// TestAlertBackoffAttempts: migration 00049 gives a pending delivery the
// backoff its attempts had reached, and every other one none (a
// redelivery starts it again).
func TestAlertBackoffAttempts(t *testing.T) {
	ctx := context.Background()
	pool := poolAt(t, 48)
	for _, sql := range []string{
		`INSERT INTO alert_events (id, rule, subject, meter, type, body, occurred_at)
		 VALUES ('00000000-0000-0000-0000-000000000001', 'r', 'global', 'calls', 'alert.triggered', '{}', now())`,
		`INSERT INTO alert_deliveries (event_id, endpoint, rule, subject, seq, state, attempts, next_attempt_at, give_up_at, created_at)
		 VALUES ('00000000-0000-0000-0000-000000000001', 'retrying', 'r', 'global', 1, 'pending', 7, now(), now(), now()),
		        ('00000000-0000-0000-0000-000000000001', 'new', 'r', 'global', 1, 'pending', 0, now(), now(), now()),
		        ('00000000-0000-0000-0000-000000000001', 'failed', 'r', 'global', 1, 'failed', 9, now(), now(), now()),
		        ('00000000-0000-0000-0000-000000000001', 'delivered', 'r', 'global', 1, 'delivered', 3, now(), now(), now())`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if err := migrations.UpTo(ctx, pool, 49); err != nil {
		t.Fatal(err)
	}
	want := map[string][2]int{"retrying": {7, 7}, "new": {0, 0}, "failed": {9, 0}, "delivered": {3, 0}}
	rows, err := pool.Query(ctx, `SELECT endpoint, attempts, backoff_attempts FROM alert_deliveries`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var endpoint string
		var got [2]int
		if err := rows.Scan(&endpoint, &got[0], &got[1]); err != nil {
			t.Fatal(err)
		}
		if got != want[endpoint] {
			t.Errorf("%s: attempts and backoff_attempts %v, want %v", endpoint, got, want[endpoint])
		}
		n++
	}
	if err := rows.Err(); err != nil || n != len(want) {
		t.Fatalf("%d deliveries: %v", n, err)
	}
}
