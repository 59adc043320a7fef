package enforcebench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/alerts"
	"github.com/tally-ledger/tally/quota"
)

// webhookTimes is the in-process receiver: when the first request for
// each (customer, percent) arrived.
type webhookTimes struct {
	mu    sync.Mutex
	first map[string]time.Time
	bad   int // requests whose signature did not verify
}

// startAlerts puts a webhook to a receiver of its own and an alert rule
// on every customer at 80% and 100% of its quota, and runs the evaluator
// (under enf's lease) and the dispatcher until ctx ends.
func startAlerts(ctx context.Context, wg *sync.WaitGroup, o Options, enf *quota.Enforcer, meter string) (*webhookTimes, error) {
	h := &webhookTimes{first: map[string]time.Time{}}
	var secret string
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		body, _ := io.ReadAll(r.Body)
		var ev alerts.Event
		_ = json.Unmarshal(body, &ev)
		h.mu.Lock()
		if alerts.Verify(secret, r.Header.Get("Tally-Signature"), body, at, time.Minute) != nil {
			h.bad++
		}
		if ev.Threshold.Percent != nil {
			k := ev.Customer + "|" + ev.Threshold.Percent.String()
			if _, ok := h.first[k]; !ok {
				h.first[k] = at
			}
		}
		h.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})}
	wg.Add(1)
	go func() {
		defer wg.Done()
		go func() { <-ctx.Done(); _ = srv.Close() }()
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			o.Logger.Warn("enforcebench: webhook receiver", "err", err)
		}
	}()
	now := time.Now()
	_, s, _, err := alerts.PutWebhook(ctx, o.Pool, alerts.WebhookInput{Name: "bench", URL: "http://" + ln.Addr().String() + "/",
		AllowPrivate: true}, now)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	secret = s
	h.mu.Unlock()
	eighty, hundred := decimal.NewFromInt(80), decimal.NewFromInt(100)
	if _, _, err := alerts.PutRule(ctx, o.Pool, alerts.RuleInput{Name: "bench", Subject: alerts.SubjectCustomers, Meter: meter,
		Thresholds: []alerts.Threshold{{Percent: &eighty}, {Percent: &hundred}}, NotifyOn: []string{alerts.Triggered},
		Endpoints: []string{"bench"}, Actor: "bench"}, now); err != nil {
		return nil, err
	}
	disp, err := alerts.NewDispatcher(alerts.DispatcherConfig{Pool: o.Pool, AllowPrivate: true, Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	eval, err := alerts.NewEvaluator(alerts.EvaluatorConfig{Pool: o.Pool, Leader: enf, IngestTopic: o.IngestTopic,
		Logger: o.Logger, Committed: disp.Wake})
	if err != nil {
		return nil, err
	}
	wg.Add(2)
	go func() { defer wg.Done(); _ = disp.Run(ctx) }()
	go func() { defer wg.Done(); _ = eval.Run(ctx) }()
	return h, nil
}

const qIngestedAt = `
SELECT r.ingested_at FROM records r JOIN streams s ON s.id = r.stream_id
WHERE s.customer = $1 AND s.meter = $2 AND r.seq = $3`

// fill sets c's Ingested (the crossing record's: seq = its total, one
// unit per record) and Webhook.
func (h *webhookTimes) fill(ctx context.Context, pool *pgxpool.Pool, c *Crossing, meter string) error {
	if err := pool.QueryRow(ctx, qIngestedAt, c.Customer, meter, c.Threshold).Scan(&c.Ingested); err != nil {
		return fmt.Errorf("enforcebench: ingested_at of %s seq %d: %w", c.Customer, c.Threshold, err)
	}
	pctOf := "80"
	if c.State == quota.Exceeded {
		pctOf = "100"
	}
	h.mu.Lock()
	c.Webhook = h.first[c.Customer+"|"+pctOf]
	h.mu.Unlock()
	return nil
}

// AlertLatency returns ingest transaction → webhook request p50 and p99
// over the crossings that had a webhook, and how many had none.
func (r Result) AlertLatency() (p50, p99 time.Duration, n, missing int) {
	var lat []time.Duration
	for _, c := range r.Crossings {
		switch {
		case c.Ingested.IsZero():
		case c.Webhook.IsZero():
			missing++
		default:
			lat = append(lat, c.Webhook.Sub(c.Ingested))
		}
	}
	return pct(lat, 0.5), pct(lat, 0.99), len(lat), missing
}

func (r Result) reportAlerts(w io.Writer) {
	var lat, fromProduce []time.Duration
	missing := 0
	for _, c := range r.Crossings {
		switch {
		case c.Ingested.IsZero():
		case c.Webhook.IsZero():
			missing++
		default:
			lat = append(lat, c.Webhook.Sub(c.Ingested))
			fromProduce = append(fromProduce, c.Webhook.Sub(c.Produced))
		}
	}
	if len(lat) == 0 && missing == 0 {
		return
	}
	fmt.Fprintf(w, "ingest transaction (ingested_at) → alert webhook request: p50 %v p99 %v max %v (n=%d crossings of 80%% or 100%%; %d without a webhook)   (target p99 ≤ 2s)\n",
		pct(lat, 0.5).Round(time.Millisecond), pct(lat, 0.99).Round(time.Millisecond), pct(lat, 1).Round(time.Millisecond), len(lat), missing)
	if len(fromProduce) > 0 {
		fmt.Fprintf(w, "produce → alert webhook request: p50 %v p99 %v (the decision's basis above)\n",
			pct(fromProduce, 0.5).Round(time.Millisecond), pct(fromProduce, 0.99).Round(time.Millisecond))
	}
}
