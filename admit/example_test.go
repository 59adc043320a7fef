package admit_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tally-ledger/tally/admit"
)

// A gateway wires the SDK once, when it starts: Check says what is wrong
// with the setup before any request, New makes the one client, and Close
// runs at shutdown. Only Admit runs per request, in the handler. (It
// needs a running Tally, so it is compiled, not run.)
func Example() {
	ctx := context.Background()
	cfg := admit.Config{
		URL:           "http://127.0.0.1:8080",
		Token:         os.Getenv("TALLY_GATEWAY_TOKEN"), // tally tokens create --gateway gw-eu-1
		Holder:        "gw-eu-1",
		Dir:           "/var/lib/gateway/tally",     // generation, bypass journal, final spend reports: keep it across restarts
		OnUnreachable: admit.Deny,                   // until a grant brings the rule's own policy
		Brokers:       []string{"127.0.0.1:9092"},   // lagged rules: decisions from tally.quota-decisions
		Registerer:    prometheus.DefaultRegisterer, // tally_admit_* on the gateway's /metrics
	}
	if err := admit.Check(ctx, cfg); err != nil { // says what is wrong: token, holder, URL
		log.Fatal(err)
	}
	c, err := admit.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(ctx) // releases what was not spent; an *admit.UndeliveredError says what stays in Dir

	srv := &http.Server{Addr: "127.0.0.1:8081", Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, err := c.Admit(r.Context(), r.Header.Get("X-Customer"), "tokens", 1)
		if err != nil { // a setup mistake or a local fault, never an outage
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if !d.Admitted {
			http.Error(w, fmt.Sprintf("%s exhausted, retry after %s", d.Binding, d.RetryAfter), http.StatusTooManyRequests)
			return
		}
		fmt.Fprintln(w, "admitted")
	})}
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Print(err)
	}
}
