package cli

import (
	"strings"
	"testing"
	"time"
)

// --rate is the trace's requests per second when it is a bare number, and
// a rate contract (the rate-contract run) when it is AMOUNT/PER[,burst=B].
func TestBenchAdmissionRateFlag(t *testing.T) {
	for _, c := range []struct {
		args     []string
		contract bool
		rate     int
		amount   int64
		per      time.Duration
		burst    int64
	}{
		{args: nil, rate: 2000},
		{args: []string{"--rate", "500"}, rate: 500},
		{args: []string{"--rate", "100/s,burst=200"}, contract: true, rate: 2000, amount: 100, per: time.Second, burst: 200},
		{args: []string{"--rate", "50/500ms"}, contract: true, rate: 2000, amount: 50, per: 500 * time.Millisecond, burst: 100},
		{args: []string{"--rate", "10/1m,burst=5"}, contract: true, rate: 2000, amount: 10, per: time.Minute, burst: 5},
	} {
		cmd := newBenchAdmissionCmd()
		if err := cmd.ParseFlags(c.args); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		o := cmd.Flags().Lookup("rate").Value.(rateFlag).o
		if o.rateContract != c.contract || o.sim.Rate != c.rate ||
			(c.contract && (o.rate.Amount != c.amount || o.rate.Per != c.per || o.rate.Burst != c.burst)) {
			t.Errorf("%v: contract %v rate %d, %d/%s burst %d", c.args, o.rateContract, o.sim.Rate, o.rate.Amount, o.rate.Per, o.rate.Burst)
		}
	}
	for value, want := range map[string]string{
		"0":             "neither requests per second",
		"fast":          "neither requests per second",
		"0/s":           "amount before /",
		"100/soon":      "period after /",
		"100/s,200":     "burst=N",
		"100/s,burst=0": "burst=N",
	} {
		err := newBenchAdmissionCmd().ParseFlags([]string{"--rate", value})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--rate %s: %v, want an error saying %q", value, err, want)
		}
	}
}
