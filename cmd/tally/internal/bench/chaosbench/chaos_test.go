package chaosbench_test

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tally-ledger/tally/cmd/tally/internal/bench/chaosbench"
	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The short schedule: three members, four partitions, seven faults (each
// kind once) of up to 2.5s (past the 1.5s lease) on the members' Postgres
// and Kafka links, freezes and restarts, under steady production. Totals are exact, offsets never moved
// back, every member is ready again after the last fault.
func TestShortFaultSchedule(t *testing.T) {
	const topic = "tally.meter-batches"
	k := kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{{Name: topic, Partitions: 4}}})
	var out strings.Builder
	cfg := chaosbench.Config{DatabaseURL: pgtest.NewURL(t), Broker: k.Addrs[0], Topic: topic, Members: 3, Seed: 1,
		Steps: len(chaosbench.Faults), MaxFault: 2500 * time.Millisecond, Out: &out,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))}
	sched := chaosbench.Schedule(cfg)
	seen := map[string]bool{}
	for _, s := range sched {
		seen[s.Fault] = true
	}
	if len(seen) != len(chaosbench.Faults) {
		t.Fatalf("the short schedule draws %v, not every fault", seen)
	}
	rep, err := chaosbench.Run(context.Background(), cfg)
	t.Logf("schedule:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Records == 0 || len(rep.Schedule) != len(chaosbench.Faults) {
		t.Fatalf("report %+v: nothing was produced or the schedule was not run", rep)
	}
	t.Logf("%d records in %d messages, exact; every member ready and caught up %v after the last fault; faults %v",
		rep.Records, rep.Messages, rep.Healed, seen)
}

// A schedule is a function of its seed: a failure is replayed by its seed.
func TestScheduleIsSeeded(t *testing.T) {
	a, b := chaosbench.Schedule(chaosbench.Config{Seed: 7, Steps: 20}), chaosbench.Schedule(chaosbench.Config{Seed: 7, Steps: 20})
	c := chaosbench.Schedule(chaosbench.Config{Seed: 8, Steps: 20})
	if len(a) != 20 {
		t.Fatalf("%d steps", len(a))
	}
	same, differs := true, false
	for i := range a {
		same = same && a[i] == b[i]
		differs = differs || a[i] != c[i]
		if a[i].For < 200*time.Millisecond || a[i].For > 3*time.Second || a[i].Member < 0 || a[i].Member > 2 {
			t.Errorf("step %v out of range", a[i])
		}
	}
	if !same || !differs {
		t.Errorf("seed 7 twice gave the same schedule: %v; seed 8 differs: %v", same, differs)
	}
}
