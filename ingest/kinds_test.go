package ingest_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/tally-ledger/tally/ledger"
)

// Gauge and unique records travel the same path as counters; a record
// whose shape is not its meter's declared kind is a dead letter with its
// own reason and its exact bytes.
func TestGaugeAndUniqueRecordsAreIngested(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := context.Background()
	for meter, kind := range map[string]ledger.MeterKind{"seats": ledger.Gauge, "active_users": ledger.Unique} {
		if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			_, err := ledger.DeclareMeter(ctx, tx, ledger.Meter{Meter: meter, Kind: kind}, time.Now())
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	// storage_gb is not declared: its level record is refused.
	v, err := os.ReadFile("../testdata/batches/valid-gauge-unique.json")
	if err != nil {
		t.Fatal(err)
	}
	e.kafka.Produce(t, topic, kafka.Message{Key: []byte("acme"), Value: v}, kafka.Message{Key: []byte("acme"), Value: v})
	m := e.start()
	e.waitCaughtUp(30 * time.Second)
	m.Stop(t)
	e.checkOffsets()
	c := e.checkCounters()
	if c.Applied != 2 || c.Duplicate != 2 || c.Rejected != 2 {
		t.Errorf("counters %+v: want 2 applied, 2 duplicates, 2 rejected", c)
	}
	var reason, detail string
	var raw []byte
	if err := e.pool.QueryRow(ctx, `SELECT reason, detail, raw FROM dead_letters ORDER BY id LIMIT 1`).Scan(&reason, &detail, &raw); err != nil {
		t.Fatal(err)
	}
	if reason != ledger.ReasonKindMismatch || !strings.Contains(detail, `"storage_gb" is a counter`) || !strings.Contains(string(raw), `"level": 0`) {
		t.Errorf("dead letter %s %q %s", reason, detail, raw)
	}
	var level, members string
	if err := e.pool.QueryRow(ctx, `SELECT (SELECT level::text FROM gauge_readings WHERE meter = 'seats'),
		(SELECT members::text FROM unique_counts WHERE meter = 'active_users' AND NOT per_day)`).Scan(&level, &members); err != nil {
		t.Fatal(err)
	}
	if level != "42" || members != "1" {
		t.Errorf("seats level %s, active users %s", level, members)
	}
}
