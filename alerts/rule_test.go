package alerts_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/alerts"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/validation"
)

func TestRuleValidationNamesEveryField(t *testing.T) {
	t.Parallel()
	in := alerts.RuleInput{Name: "bad name", Subject: "tenant:x", Meter: "", Thresholds: []alerts.Threshold{{}},
		NotifyOn: []string{"fired"}, Endpoints: []string{"no/slash"}}
	err := in.Validate()
	if !errors.Is(err, alerts.ErrInvalid) {
		t.Fatalf("err %v", err)
	}
	var fields []string
	for _, fe := range validation.Fields(err) {
		fields = append(fields, fe.Field)
	}
	want := []string{"name", "subject", "meter", "thresholds[0]", "notify_on[0]", "endpoints[0]", "actor"}
	if !slices.Equal(fields, want) {
		t.Fatalf("fields %v, want %v", fields, want)
	}
}

func TestRuleEndpointsMustExistAndVersionsGrow(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t)
	ctx := context.Background()
	in := alerts.RuleInput{Name: "r", Subject: "customers", Meter: "calls", Actor: "t", Endpoints: []string{"ops"},
		Thresholds: []alerts.Threshold{{Value: ptr(decimalOf("5"))}}}
	_, _, err := alerts.PutRule(ctx, pool, in, time.Now())
	if fs := validation.Fields(err); len(fs) != 1 || fs[0].Field != "endpoints[0]" {
		t.Fatalf("unknown endpoint: %v", err)
	}
	// Every field at fault at once: an unknown endpoint is named beside a
	// threshold at fault, not only once the threshold is mended.
	bad := in
	bad.Thresholds = []alerts.Threshold{{}}
	_, _, err = alerts.PutRule(ctx, pool, bad, time.Now())
	var fields []string
	for _, fe := range validation.Fields(err) {
		fields = append(fields, fe.Field)
	}
	if !errors.Is(err, alerts.ErrInvalid) || !slices.Equal(fields, []string{"thresholds[0]", "endpoints[0]"}) {
		t.Fatalf("a threshold at fault and an unknown endpoint: fields %v (%v)", fields, err)
	}
	if _, _, _, err := alerts.PutWebhook(ctx, pool, alerts.WebhookInput{Name: "ops", URL: "http://127.0.0.1:9/x"}, time.Now()); len(validation.Fields(err)) != 1 {
		t.Fatalf("a loopback webhook without AllowPrivate: %v", err)
	}
	w, secret, created, err := alerts.PutWebhook(ctx, pool, alerts.WebhookInput{Name: "ops", URL: "https://hooks.example.com/x"}, time.Now())
	if err != nil || !created || len(secret) < 40 || !slices.Equal(w.Events, alerts.EventTypes) {
		t.Fatalf("webhook %+v %q %v %v", w, secret, created, err)
	}
	if _, again, created, _ := alerts.PutWebhook(ctx, pool, alerts.WebhookInput{Name: "ops", URL: "https://hooks.example.com/y"}, time.Now()); again != "" || created {
		t.Fatalf("an update showed the secret again or said created")
	}
	rotated, err := alerts.RotateSecret(ctx, pool, "ops", 0)
	if err != nil || rotated == secret {
		t.Fatalf("rotate: %q %v", rotated, err)
	}
	r1, created, err := alerts.PutRule(ctx, pool, in, time.Now())
	if err != nil || !created || r1.Version != 1 {
		t.Fatalf("put: %+v %v %v", r1, created, err)
	}
	r2, created, err := alerts.PutRule(ctx, pool, in, time.Now())
	if err != nil || created || r2.Version != 2 {
		t.Fatalf("second put: %+v %v %v", r2, created, err)
	}
	if err := alerts.DeleteRule(ctx, pool, "r", "t", time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := alerts.GetRule(ctx, pool, "r"); !errors.Is(err, alerts.ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
	if err := alerts.DeleteRule(ctx, pool, "r", "t", time.Now()); !errors.Is(err, alerts.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	r4, created, err := alerts.PutRule(ctx, pool, in, time.Now())
	if err != nil || !created || r4.Version != 4 {
		t.Fatalf("put after delete: %+v %v %v", r4, created, err)
	}
}

func TestSignatureVerifies(t *testing.T) {
	t.Parallel()
	at := time.Unix(1764806400, 0)
	body := []byte(`{"id":"x"}`)
	sig := alerts.Sign("whsec_k", at, body)
	// printf '%s' '1764806400.{"id":"x"}' | openssl dgst -sha256 -hmac whsec_k -hex
	if sig != "t=1764806400,v1=421612972ebc3d3b3dba54383205f254482aa9200a6fef05196bddbeae3a106b" {
		t.Fatalf("signature %q", sig)
	}
	if err := alerts.Verify("whsec_k", sig, body, at, time.Minute); err != nil {
		t.Fatal(err)
	}
	// While a rotation's overlap lasts, one signature per secret, the new
	// secret's first: either verifies.
	both := alerts.Sign("whsec_k", at, body, "whsec_j")
	if both != sig+",v1="+strings.TrimPrefix(alerts.Sign("whsec_j", at, body), "t=1764806400,v1=") {
		t.Fatalf("signature with two secrets %q", both)
	}
	for _, secret := range []string{"whsec_k", "whsec_j"} {
		if err := alerts.Verify(secret, both, body, at, time.Minute); err != nil {
			t.Errorf("%s with two signatures: %v", secret, err)
		}
	}
	for name, f := range map[string]func() error{
		"two signatures, neither by it": func() error { return alerts.Verify("whsec_x", both, body, at, time.Minute) },
		"other secret":                  func() error { return alerts.Verify("whsec_j", sig, body, at, time.Minute) },
		"other body":                    func() error { return alerts.Verify("whsec_k", sig, []byte(`{"id":"y"}`), at, time.Minute) },
		"too old":                       func() error { return alerts.Verify("whsec_k", sig, body, at.Add(time.Hour), time.Minute) },
		"malformed":                     func() error { return alerts.Verify("whsec_k", "v1=00", body, at, time.Minute) },
	} {
		if f() == nil {
			t.Errorf("%s: verified", name)
		}
	}
}

// Public is true only of addresses anyone on the internet may reach: every
// special-purpose range is refused, and an address that carries an IPv4
// one (NAT64, 6to4, IPv4-mapped) is judged by it.
func TestPublicRefusesEveryNonGlobalAddress(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"93.184.215.14": true, "2606:2800:21f:cb07:6820:80da:af6b:8b2c": true, "64:ff9b::5db8:d70e": true, // NAT64 of a public one
		"127.0.0.1": false, "10.1.2.3": false, "172.16.0.1": false, "192.168.1.1": false, "100.64.0.1": false,
		"169.254.169.254": false, "0.0.0.0": false, "0.0.0.1": false, "192.0.0.8": false, "192.0.2.1": false,
		"198.18.0.1": false, "198.51.100.7": false, "203.0.113.9": false, "240.0.0.1": false, "255.255.255.255": false,
		"224.0.0.1": false, "::1": false, "::": false, "::127.0.0.1": false, "::ffff:10.0.0.1": false,
		"64:ff9b::a00:1": false, "64:ff9b:1::1": false, "2002:a00:1::1": false, "2001:db8::1": false,
		"fc00::1": false, "fe80::1": false, "fec0::1": false, "ff02::1": false, "100::1": false, "2001::1": false,
	} {
		if got := alerts.Public(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Public(%s) = %v, want %v", addr, got, want)
		}
	}
	for _, u := range []string{"http://LOCALHOST:9/x", "http://localhost.:9/x", "http://api.localhost/x", "http://[::127.0.0.1]/x"} {
		if _, _, _, err := alerts.PutWebhook(context.Background(), pgtest.New(t), alerts.WebhookInput{Name: "ops", URL: u}, time.Now()); len(validation.Fields(err)) != 1 {
			t.Errorf("%s without AllowPrivate: %v", u, err)
		}
	}
}

// TestPercentThresholdIsExact: a percent threshold stands for exactly
// limit × percent / 100, however many places that takes (a limit has up
// to 9 after the point, a percent up to 6), so usage just under it never
// triggers it.
func TestPercentThresholdIsExact(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ limit, percent, want string }{
		{"0.000000001", "0.000001", "0.00000000000000001"},
		{"1.000000001", "0.000001", "0.00000001000000001"}, // usage 0.00000001 is under it
		{"100", "80", "80"},
	} {
		limit, p := decimal.RequireFromString(c.limit), decimal.RequireFromString(c.percent)
		got, ok := alerts.Threshold{Percent: &p}.At(&limit)
		if want := decimal.RequireFromString(c.want); !ok || !got.Equal(want) {
			t.Errorf("%s%% of %s: %s (%v), want %s", c.percent, c.limit, got, ok, want)
		}
	}
}

// TestDeleteRacingPutsOfTheRule: a DELETE of a live rule racing PUTs of
// it succeeds, as each PUT does, however many race: no writer fails on
// the version another took, and each writes a version of its own. The rule is deleted after
// the round when the DELETE wrote the last version, else a PUT recreated
// it.
func TestDeleteRacingPutsOfTheRule(t *testing.T) {
	t.Parallel()
	pool := pgtest.New(t)
	ctx := context.Background()
	in := alerts.RuleInput{Name: "r", Subject: "customers", Meter: "calls", Actor: "t",
		Thresholds: []alerts.Threshold{{Value: ptr(decimalOf("5"))}}}
	for round := range 20 {
		if _, _, err := alerts.PutRule(ctx, pool, in, time.Now()); err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		errs := make(chan error, 9)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				<-start
				_, _, err := alerts.PutRule(ctx, pool, in, time.Now())
				errs <- err
			})
		}
		wg.Go(func() {
			<-start
			if err := alerts.DeleteRule(ctx, pool, "r", "t", time.Now()); err != nil {
				errs <- fmt.Errorf("delete: %w", err)
			}
		})
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		var versions, last, deletes int
		var lastDeleted bool
		if err := pool.QueryRow(ctx, `SELECT count(*), max(version), count(*) FILTER (WHERE deleted),
			(SELECT deleted FROM alert_rules WHERE name = 'r' ORDER BY version DESC LIMIT 1) FROM alert_rules WHERE name = 'r'`).
			Scan(&versions, &last, &deletes, &lastDeleted); err != nil {
			t.Fatal(err)
		}
		if want := 10 * (round + 1); versions != want || last != want || deletes != round+1 {
			t.Fatalf("round %d: %d versions, the last %d, %d deleted; want %d, %d, %d", round, versions, last, deletes, want, want, round+1)
		}
		if _, err := alerts.GetRule(ctx, pool, "r"); errors.Is(err, alerts.ErrNotFound) != lastDeleted {
			t.Fatalf("round %d: the last version deleted %v, GET: %v", round, lastDeleted, err)
		}
	}
}
