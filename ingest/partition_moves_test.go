package ingest_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"
)

// A customer whose messages arrive on two partitions (a producer whose
// partitioner is not the SDK's murmur2) is counted and logged: the ledger
// stays exact, but the customer's usage as_of and quota lag follow
// whichever partition was seen last (docs/design.md §2).
func TestACustomerOnTwoPartitionsIsCounted(t *testing.T) {
	e := newEnv(t, 2)
	rng := rand.New(rand.NewPCG(1, 2))
	s := models(1)[0]
	e.kafka.ProduceTo(t, topic, 0, encode(t, s.next(rng, 3)))
	m := e.start()
	e.waitCaughtUp(30 * time.Second)
	e.kafka.ProduceTo(t, topic, 1, encode(t, s.next(rng, 3)))
	e.waitCaughtUp(30 * time.Second)
	var part int
	if err := e.pool.QueryRow(context.Background(), `SELECT partition FROM ingest_customers WHERE customer = $1`, s.customer).Scan(&part); err != nil || part != 1 {
		t.Fatalf("the customer's partition: %d %v, want 1 (the last seen)", part, err)
	}
	if n := m.Metric("tally_ingest_customer_partition_moves_total", nil); n != 1 {
		t.Errorf("tally_ingest_customer_partition_moves_total = %v, want 1", n)
	}
	m.Stop(t)
}
