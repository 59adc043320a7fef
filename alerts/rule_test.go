package alerts_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

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
	rotated, err := alerts.RotateSecret(ctx, pool, "ops", time.Now())
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
	for name, f := range map[string]func() error{
		"other secret": func() error { return alerts.Verify("whsec_j", sig, body, at, time.Minute) },
		"other body":   func() error { return alerts.Verify("whsec_k", sig, []byte(`{"id":"y"}`), at, time.Minute) },
		"too old":      func() error { return alerts.Verify("whsec_k", sig, body, at.Add(time.Hour), time.Minute) },
		"malformed":    func() error { return alerts.Verify("whsec_k", "v1=00", body, at, time.Minute) },
	} {
		if f() == nil {
			t.Errorf("%s: verified", name)
		}
	}
}
