package admit_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/tally-ledger/tally/admit"
)

// A gateway wires the SDK once, then asks Admit on every request.
func Example() {
	c, err := admit.New(admit.Config{
		URL:           "http://127.0.0.1:8080",
		Token:         os.Getenv("TALLY_GATEWAY_TOKEN"), // tally tokens create --gateway gw-eu-1
		Holder:        "gw-eu-1",
		Dir:           "/var/lib/gateway/tally",   // generation and bypass journal
		OnUnreachable: admit.Deny,                 // until a grant brings the rule's policy
		Brokers:       []string{"127.0.0.1:9092"}, // lagged rules: decisions from tally.quota-decisions
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(context.Background()) // releases unspent capacity

	d, err := c.Admit(context.Background(), "acme", "tokens", 1)
	if err != nil {
		log.Fatal(err)
	}
	if !d.Admitted {
		fmt.Printf("429: %s exhausted, retry after %s\n", d.Binding, d.RetryAfter)
	}
}
