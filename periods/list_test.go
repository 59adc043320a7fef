package periods_test

import (
	"context"
	"slices"
	"testing"

	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/periods"
)

func TestCustomerIDsPageInOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.New(t)
	for _, id := range []string{"globex", "acme", "initech", "zeta"} {
		if _, _, err := (periods.Store{}).SetCalendar(ctx, pool, id, periods.DefaultCalendar()); err != nil {
			t.Fatal(err)
		}
	}
	first, err := periods.CustomerIDs(ctx, pool, "", 2)
	if err != nil || !slices.Equal(first, []string{"acme", "globex"}) {
		t.Fatalf("first page %v %v", first, err)
	}
	rest, err := periods.CustomerIDs(ctx, pool, first[len(first)-1], 0)
	if err != nil || !slices.Equal(rest, []string{"initech", "zeta"}) {
		t.Fatalf("after %q: %v %v", first[1], rest, err)
	}
}
