package cli

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/alerts"
)

// The alert of tally dev: demo-acme's quota at 80% and 100%, delivered to
// a receiver tally dev runs, which logs each signed request.
const (
	devAlertName   = "demo-acme-quota"
	devWebhookName = "dev-receiver"
)

// devAlerts starts the receiver on a free loopback port, points the
// webhook dev-receiver at it (a new secret each run) and puts the alert
// rule; the receiver stops when ctx ends.
func devAlerts(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	log = log.With("component", "dev-receiver")
	var secret atomic.Pointer[string]
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		verified := "no secret"
		if s := secret.Load(); s != nil {
			verified = "ok"
			if err := alerts.Verify(*s, r.Header.Get("Tally-Signature"), body, time.Now(), 5*time.Minute); err != nil {
				verified = err.Error()
			}
		}
		var ev alerts.Event
		_ = json.Unmarshal(body, &ev)
		log.Info("webhook received", "type", ev.Type, "alert", ev.Alert, "subject", ev.Subject, "period", ev.Period,
			"threshold", ev.Threshold.Value, "used", ev.Used, "reason", ev.Reason,
			"tally_event_id", r.Header.Get("Tally-Event-Id"), "tally_signature", r.Header.Get("Tally-Signature"), "signature", verified)
		w.WriteHeader(http.StatusNoContent)
	})}
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Warn("dev webhook receiver stopped", "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	now := time.Now()
	url := "http://" + ln.Addr().String() + "/tally-alerts"
	if _, _, _, err := alerts.PutWebhook(ctx, pool, alerts.WebhookInput{Name: devWebhookName, URL: url, AllowPrivate: true}, now); err != nil {
		return err
	}
	s, err := alerts.RotateSecret(ctx, pool, devWebhookName, 0) // this run's receiver knows this one
	if err != nil {
		return err
	}
	secret.Store(&s)
	eighty, hundred := decimalPtr("80"), decimalPtr("100")
	_, _, err = alerts.PutRule(ctx, pool, alerts.RuleInput{Name: devAlertName, Subject: "customer:" + simCustomer, Meter: simMeter,
		Thresholds: []alerts.Threshold{{Percent: eighty}, {Percent: hundred}}, Endpoints: []string{devWebhookName},
		Actor: "tally dev"}, now)
	if err != nil {
		return err
	}
	log.Info("dev webhook receiver listening; alert "+devAlertName+" on demo-acme's quota at 80% and 100% is delivered here", "url", url)
	return nil
}

func decimalPtr(s string) *decimal.Decimal {
	d := decimal.RequireFromString(s)
	return &d
}
