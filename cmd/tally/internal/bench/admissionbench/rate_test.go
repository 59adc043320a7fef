package admissionbench_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/tally-ledger/tally/cmd/tally/internal/bench/admissionbench"
	"github.com/tally-ledger/tally/internal/pgtest"
)

// Twenty local buckets, each enforcing the whole contract, admit about
// twenty times the burst in the first second; grants through the SDK, and
// a central counter, stay within the §17 bound.
func TestRateTwentyGatewaysOneBurst(t *testing.T) {
	o := admissionbench.RateOptions{DatabaseURL: pgtest.NewURL(t), Gateways: 20, Amount: 20, Per: time.Second, Burst: 20,
		Background: 80, Duration: 2 * time.Second, RedisAddr: redisAddr, Seed: 3}
	r, err := admissionbench.RunRate(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	r.Report(&buf)
	t.Log("\n" + buf.String())
	rows := map[string]admissionbench.RateRow{}
	for _, row := range r.Rows {
		rows[row.Design] = row
	}
	local := rows["local token bucket per gateway"]
	if local.FirstSecond < 18*o.Burst || local.Bound < 5 {
		t.Errorf("local buckets: %d admitted in the first second (want about %d), worst window %.2f × the bound", local.FirstSecond, 20*o.Burst, local.Bound)
	}
	for _, name := range []string{"grants through the admit SDK", "central counter, Postgres"} {
		row := rows[name]
		if row.Admitted == 0 || row.Bound > 1 {
			t.Errorf("%s: %d admitted (%d in the first second), worst window %.3f × the bound", name, row.Admitted, row.FirstSecond, row.Bound)
		}
	}
	if red := rows["central counter, Redis"]; red.Skipped == "" && red.Bound > 1 {
		t.Errorf("Redis: worst window %.3f × the bound", red.Bound)
	}
}
