package alerts_test

import (
	"context"
	"testing"
	"time"

	"github.com/tally-ledger/tally/alerts"
	"github.com/tally-ledger/tally/validation"
)

// A rotation may keep the previous secret for an overlap: until it ends,
// every delivery carries a signature by each secret (the new one first),
// so a receiver that still knows only the old one verifies it, and one
// that already knows the new one does too. A rotation without an overlap
// signs with the new secret alone at once (a leaked secret is cut off).
func TestRotationKeepsThePreviousSecretForItsOverlap(t *testing.T) {
	e := newEnv(t)
	rec := newReceiver(t)
	old := e.webhook("billing", rec.url())
	ctx := context.Background()
	if _, err := alerts.RotateSecret(ctx, e.pool, "billing", 8*24*time.Hour); len(validation.Fields(err)) != 1 || validation.Fields(err)[0].Field != "keep_previous_for" {
		t.Fatalf("an overlap past 7 days: %v", err)
	}
	before := e.dbNow()
	rotated, err := alerts.RotateSecret(ctx, e.pool, "billing", time.Hour)
	if err != nil || rotated == old {
		t.Fatalf("rotate: %q %v", rotated, err)
	}
	after := e.dbNow()
	w, err := alerts.GetWebhook(ctx, e.pool, "billing")
	if err != nil || w.PreviousUntil == nil || w.PreviousUntil.Before(before.Add(time.Hour)) || w.PreviousUntil.After(after.Add(time.Hour)) {
		t.Fatalf("webhook after a rotation with an overlap: %+v %v", w, err)
	}
	e.quota("acme", "calls", 100)
	e.rule("acme-calls", `{"subject":"customer:acme","meter":"calls","thresholds":[{"percent":"80"},{"percent":"100"}],"endpoints":["billing"]}`)
	e.start(startOptions{})
	e.use("acme", "calls", 85)
	waitFor(t, 10*time.Second, "80% delivered", func() bool { return len(rec.delivered()) == 1 })
	first := rec.delivered()[0]
	for name, secret := range map[string]string{"old": old, "new": rotated} {
		if err := alerts.Verify(secret, first.sig, first.body, first.at, time.Minute); err != nil {
			t.Errorf("during the overlap, the %s secret: %v (%s)", name, err, first.sig)
		}
	}

	latest, err := alerts.RotateSecret(ctx, e.pool, "billing", 0)
	if err != nil {
		t.Fatal(err)
	}
	if w, _ := alerts.GetWebhook(ctx, e.pool, "billing"); w.PreviousUntil != nil {
		t.Fatalf("a rotation without an overlap keeps the previous secret until %v", w.PreviousUntil)
	}
	e.use("acme", "calls", 20)
	waitFor(t, 10*time.Second, "100% delivered", func() bool { return len(rec.delivered()) == 2 })
	second := rec.delivered()[1]
	if err := alerts.Verify(latest, second.sig, second.body, second.at, time.Minute); err != nil {
		t.Errorf("the latest secret: %v", err)
	}
	for name, secret := range map[string]string{"first": old, "second": rotated} {
		if alerts.Verify(secret, second.sig, second.body, second.at, time.Minute) == nil {
			t.Errorf("after a rotation without an overlap, the %s secret still verifies", name)
		}
	}
}

// TestRotationOverlapIsThePostgresClocks: a rotation's time and the end of
// its overlap are Postgres's, the clock the dispatcher signs by, whatever
// the clock of the host that asked for it: the previous secret signs
// beside the new one until keep_previous_for after the rotation was
// written.
func TestRotationOverlapIsThePostgresClocks(t *testing.T) {
	e := newEnv(t)
	rec := newReceiver(t)
	old := e.webhook("billing", rec.url())
	ctx := context.Background()
	before := e.dbNow()
	rotated, err := alerts.RotateSecret(ctx, e.pool, "billing", 30*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	after := e.dbNow()
	w, err := alerts.GetWebhook(ctx, e.pool, "billing")
	if err != nil || w.RotatedAt.Before(before) || w.RotatedAt.After(after) || w.PreviousUntil == nil || !w.PreviousUntil.Equal(w.RotatedAt.Add(30*time.Minute)) {
		t.Errorf("rotated at %v, previous secret valid until %v; want rotated by Postgres's clock (%v to %v), the previous secret 30m more: %v",
			w.RotatedAt, w.PreviousUntil, before, after, err)
	}
	e.rule("big", `{"subject":"customer:acme","meter":"calls","thresholds":[{"value":"10"}],"notify_on":["triggered"],"endpoints":["billing"]}`)
	e.start(startOptions{})
	e.use("acme", "calls", 11)
	waitFor(t, 10*time.Second, "delivered", func() bool { return len(rec.delivered()) == 1 })
	q := rec.delivered()[0]
	for name, secret := range map[string]string{"previous": old, "new": rotated} {
		if err := alerts.Verify(secret, q.sig, q.body, q.at, time.Minute); err != nil {
			t.Errorf("during the overlap, the %s secret: %v (%s)", name, err, q.sig)
		}
	}
}
