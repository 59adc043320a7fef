package migrations_test

import (
	"context"
	"testing"

	"github.com/tally-ledger/tally/migrations"
)

// TestUniqueReadingsBackfill: migration 00035 gives every unique reading
// written by the previous schema the period and bucket day its member
// was counted in (from unique_members), marks the earliest reading of
// each member day counted (*), and its Down rebuilds unique_members
// exactly.
func TestUniqueReadingsBackfill(t *testing.T) {
	ctx := context.Background()
	pool := poolAt(t, 34)
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// acme (New York days, monthly from the 1st) saw ann twice on Oct 31
	// local (the second at 02:00 UTC on Nov 1, still Oct 31 in New York),
	// then on Nov 2; bob on Nov 1. zeta (UTC) saw ann, another customer's
	// ann, on Nov 1. As the ledger wrote them: the readings, and per period
	// and per day each member once, with its first sighting.
	exec(`INSERT INTO streams (producer, epoch, customer, meter) VALUES ('gw', 1, 'acme', 'mau'), ('gw', 1, 'zeta', 'mau')`)
	exec(`INSERT INTO unique_readings (stream_id, seq, operation_id, customer, meter, member, occurred_at, final, late_fill, ingested_at)
	SELECT s.id, v.seq, gen_random_uuid(), s.customer, s.meter, v.member, v.at, false, false, now()
	FROM streams s JOIN (VALUES
	  ('acme', 1, 'ann', '2026-10-31T15:00:00Z'::timestamptz),
	  ('acme', 2, 'ann', '2026-11-01T02:00:00Z'),
	  ('acme', 3, 'bob', '2026-11-01T14:00:00Z'),
	  ('acme', 4, 'ann', '2026-11-02T14:00:00Z'),
	  ('zeta', 1, 'ann', '2026-11-01T02:00:00Z')
	) AS v(customer, seq, member, at) ON s.customer = v.customer`)
	exec(`INSERT INTO unique_members (customer, meter, period_start, per_day, day, member, first_at) VALUES
	  ('acme', 'mau', '2026-10-01T04:00:00Z', false, '2026-10-01T04:00:00Z', 'ann', '2026-10-31T15:00:00Z'),
	  ('acme', 'mau', '2026-10-01T04:00:00Z', true,  '2026-10-31T04:00:00Z', 'ann', '2026-10-31T15:00:00Z'),
	  ('acme', 'mau', '2026-11-01T04:00:00Z', false, '2026-11-01T04:00:00Z', 'bob', '2026-11-01T14:00:00Z'),
	  ('acme', 'mau', '2026-11-01T04:00:00Z', true,  '2026-11-01T04:00:00Z', 'bob', '2026-11-01T14:00:00Z'),
	  ('acme', 'mau', '2026-11-01T04:00:00Z', false, '2026-11-01T04:00:00Z', 'ann', '2026-11-02T14:00:00Z'),
	  ('acme', 'mau', '2026-11-01T04:00:00Z', true,  '2026-11-02T04:00:00Z', 'ann', '2026-11-02T14:00:00Z'),
	  ('zeta', 'mau', '2026-11-01T00:00:00Z', false, '2026-11-01T00:00:00Z', 'ann', '2026-11-01T02:00:00Z'),
	  ('zeta', 'mau', '2026-11-01T00:00:00Z', true,  '2026-11-01T00:00:00Z', 'ann', '2026-11-01T02:00:00Z')`)
	const members = `SELECT string_agg(format('%s/%s/%s/%s/%s/%s', customer, member, per_day,
	    to_char(period_start AT TIME ZONE 'UTC', 'MM-DD"T"HH24'), to_char(day AT TIME ZONE 'UTC', 'MM-DD"T"HH24'),
	    to_char(first_at AT TIME ZONE 'UTC', 'MM-DD"T"HH24')), ' ' ORDER BY customer, member, per_day, day)
	FROM unique_members`
	var before string
	if err := pool.QueryRow(ctx, members).Scan(&before); err != nil {
		t.Fatal(err)
	}

	if err := migrations.UpTo(ctx, pool, 35); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := pool.QueryRow(ctx, `
SELECT string_agg(format('%s/%s/%s:%s/%s%s', customer, seq, member, to_char(period_start AT TIME ZONE 'UTC', 'MM-DD"T"HH24'),
                         to_char(day AT TIME ZONE 'UTC', 'MM-DD"T"HH24'), CASE WHEN counted THEN '*' ELSE '' END), ' ' ORDER BY customer, seq)
FROM unique_readings`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	want := "acme/1/ann:10-01T04/10-31T04* acme/2/ann:10-01T04/10-31T04 acme/3/bob:11-01T04/11-01T04* " +
		"acme/4/ann:11-01T04/11-02T04* zeta/1/ann:11-01T00/11-01T00*"
	if got != want {
		t.Fatalf("readings after the migration:\n got %s\nwant %s", got, want)
	}
	var ranges string
	if err := pool.QueryRow(ctx, `
SELECT string_agg(format('%s/%s:%s-%s', sp.customer, to_char(sp.period_start AT TIME ZONE 'UTC', 'MM-DD"T"HH24'), sp.min_seq, sp.max_seq), ' '
                  ORDER BY sp.customer, sp.period_start)
FROM stream_periods sp`).Scan(&ranges); err != nil {
		t.Fatal(err)
	}
	if want := "acme/10-01T04:1-2 acme/11-01T04:3-4 zeta/11-01T00:1-1"; ranges != want {
		t.Fatalf("stream periods:\n got %s\nwant %s", ranges, want)
	}
	var left bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_tables WHERE tablename = 'unique_members')
	    OR EXISTS (SELECT 1 FROM pg_indexes WHERE indexname = 'unique_readings_customer')`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left {
		t.Fatal("unique_members or unique_readings_customer is still there")
	}

	if err := migrations.DownTo(ctx, pool, 34); err != nil {
		t.Fatal(err)
	}
	var after string
	if err := pool.QueryRow(ctx, members).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("unique_members rebuilt by Down:\n got %s\nwant %s", after, before)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*)::text FROM stream_periods`).Scan(&after); err != nil || after != "0" {
		t.Fatalf("stream periods after Down: %s %v", after, err)
	}
}
