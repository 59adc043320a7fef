package quota_test

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/tally-ledger/tally/quota"
)

// A gateway reads a decision from tally.quota-decisions and decides whether
// to admit a request.
func ExampleDecision_Blocks() {
	msg := []byte(`{"customer":"acme","meter":"api_calls","period":"2026-12-01","state":"warning",
		"used":"85000","limit":"100000","remaining":"15000","as_of":"2026-12-02T10:00:00Z",
		"lag_seconds":1.2,"projected":"85240","rule_version":3,"mode":"enforce","on_stale":"deny",
		"stale_after":300,"decided_at":"2026-12-02T10:00:01.2Z"}`)
	var d quota.Decision
	if err := json.Unmarshal(msg, &d); err != nil {
		panic(err)
	}
	now := time.Date(2026, 12, 2, 10, 0, 2, 0, time.UTC)
	fmt.Println(d.Key(), d.State, "stale:", d.Stale(now), "block:", d.Blocks(now))
	// Ten minutes later with no newer decision: older than stale_after,
	// so on_stale (deny) applies.
	later := now.Add(10 * time.Minute)
	fmt.Println("stale:", d.Stale(later), "block:", d.Blocks(later))
	// Output:
	// acme/api_calls warning stale: false block: false
	// stale: true block: true
}
