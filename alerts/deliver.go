package alerts

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
)

// Defaults of DispatcherConfig.
const (
	DefaultTimeout     = 10 * time.Second
	DefaultPoll        = 500 * time.Millisecond
	DefaultMaxInFlight = 64
	DefaultBackoffBase = time.Second
	DefaultBackoffMax  = time.Hour
)

// DispatcherConfig configures a Dispatcher.
type DispatcherConfig struct {
	Pool *pgxpool.Pool // required
	// Brokers and Topic (default "tally.alerts") receive the "kafka"
	// deliveries, keyed "<subject>/<meter>". Without Brokers they wait.
	Brokers   []string
	Topic     string
	Transport *kafka.Transport
	// Timeout bounds one webhook request, connection included (default
	// 10s). Claim is how long an attempt holds its delivery against other
	// dispatchers, so how long a delivery whose dispatcher died during an
	// attempt waits (default Timeout + 5s; must exceed Timeout).
	Timeout, Claim time.Duration
	// Poll is the longest wait between looks for due deliveries (default
	// 500ms); Wake shortens it.
	Poll time.Duration
	// MaxInFlight bounds the attempts running at once (default 64).
	MaxInFlight int
	// Failed attempts are retried after BackoffBase × 2^(n−1), n the
	// failed attempts since the delivery was created or last redelivered,
	// at most BackoffMax, with jitter (half of it random): defaults 1s
	// and 1h. A delivery not delivered by its give-up time (the
	// evaluator's RetryFor, 72h, after the delivery was written, by the
	// database's clock) is failed.
	BackoffBase, BackoffMax time.Duration
	// AllowPrivate lets webhooks reach loopback and private addresses
	// (TALLY_WEBHOOK_ALLOW_PRIVATE=true; tally dev sets it).
	AllowPrivate bool
	Logger       *slog.Logger
	Registerer   prometheus.Registerer
}

// Validate reports every configuration problem at once.
func (c DispatcherConfig) Validate() error {
	var errs []error
	if c.Pool == nil {
		errs = append(errs, errors.New("alerts: Pool is nil"))
	}
	if c.Timeout < 0 || c.Claim < 0 || c.Poll < 0 || c.BackoffBase < 0 || c.BackoffMax < 0 || c.MaxInFlight < 0 {
		errs = append(errs, errors.New("alerts: negative dispatcher setting"))
	}
	d := c.withDefaults()
	if d.Claim <= d.Timeout {
		errs = append(errs, fmt.Errorf("alerts: Claim %v must exceed Timeout %v", d.Claim, d.Timeout))
	}
	return errors.Join(errs...)
}

func (c DispatcherConfig) withDefaults() DispatcherConfig {
	if c.Topic == "" {
		c.Topic = DefaultTopic
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Claim == 0 {
		c.Claim = c.Timeout + 5*time.Second
	}
	if c.Poll == 0 {
		c.Poll = DefaultPoll
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.BackoffBase == 0 {
		c.BackoffBase = DefaultBackoffBase
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = DefaultBackoffMax
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	return c
}

// Dispatcher delivers pending deliveries: the oldest pending one of each
// (endpoint, rule, subject) at a time, each attempt in a goroutine of its
// own. Any number may run against one database (claims keep them apart).
type Dispatcher struct {
	cfg    DispatcherConfig
	log    *slog.Logger
	m      *deliveryMetrics
	client *http.Client
	wake   chan struct{}
}

// NewDispatcher returns a Dispatcher; Run starts it.
func NewDispatcher(cfg DispatcherConfig) (*Dispatcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Dispatcher{cfg: cfg, log: cfg.Logger, m: newDeliveryMetrics(cfg.Registerer),
		client: newClient(cfg.Timeout, cfg.AllowPrivate), wake: make(chan struct{}, 1)}, nil
}

// newClient is the webhooks' own HTTP client: bounded in time, no proxy
// (the address check must see the receiver's address), no redirects, and
// no connection to a loopback or private address unless allowed.
func newClient(timeout time.Duration, allowPrivate bool) *http.Client {
	dialer := &net.Dialer{Timeout: min(timeout, 5*time.Second), Control: func(_, address string, _ syscall.RawConn) error {
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			return err
		}
		ip, err := netip.ParseAddr(host)
		if err != nil {
			return err
		}
		if !allowPrivate && !Public(ip) {
			return fmt.Errorf("refused: %s is a loopback, private or local address (TALLY_WEBHOOK_ALLOW_PRIVATE is not set)", ip)
		}
		return nil
	}}
	tr := &http.Transport{
		DialContext:           dialer.DialContext,
		TLSHandshakeTimeout:   min(timeout, 5*time.Second),
		ResponseHeaderTimeout: timeout,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
	}
	return &http.Client{Transport: tr, Timeout: timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// Wake makes the dispatcher look for due deliveries now (the evaluator
// committed events).
func (d *Dispatcher) Wake() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// claimed is one delivery attempt to make.
type claimed struct {
	eventID                             uuid.UUID
	endpoint, rule, subject, meter, typ string
	body                                string
	// attempts counts every attempt made; backoffAttempts those since the
	// delivery was created or last redelivered (the backoff's n).
	attempts, backoffAttempts int
}

// Run delivers until ctx ends; attempts in flight then end (their
// deliveries are attempted again, by this or another dispatcher).
func (d *Dispatcher) Run(ctx context.Context) error {
	var w *kafka.Writer
	if len(d.cfg.Brokers) > 0 {
		tr := d.cfg.Transport
		if tr == nil {
			tr = &kafka.Transport{}
			defer tr.CloseIdleConnections()
		}
		w = &kafka.Writer{Addr: kafka.TCP(d.cfg.Brokers...), Topic: d.cfg.Topic, Balancer: &kafka.Murmur2Balancer{},
			RequiredAcks: kafka.RequireAll, BatchTimeout: 2 * time.Millisecond, MaxAttempts: 3,
			WriteTimeout: d.cfg.Timeout, ReadTimeout: d.cfg.Timeout, AllowAutoTopicCreation: true, Transport: tr}
		defer w.Close()
	}
	defer d.client.CloseIdleConnections()
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, d.cfg.MaxInFlight)
	done := make(chan struct{}, d.cfg.MaxInFlight)
	t := time.NewTicker(d.cfg.Poll)
	defer t.Stop()
	for {
		free := d.cfg.MaxInFlight - len(sem)
		if free > 0 {
			cs, err := d.claim(ctx, free)
			if err != nil && ctx.Err() == nil {
				d.log.Warn("alerts: cannot read pending deliveries; retrying", "err", err)
			}
			var hooks map[string]endpointConfig
			if len(cs) > 0 {
				if hooks, err = loadEndpoints(ctx, d.cfg.Pool); err != nil {
					d.log.Warn("alerts: cannot read webhooks; retrying", "err", err)
					d.release(ctx, cs)
					cs = nil
				}
			}
			for _, c := range cs {
				sem <- struct{}{}
				wg.Add(1)
				d.m.inFlight.Inc()
				go func() {
					defer func() {
						d.m.inFlight.Dec()
						<-sem
						wg.Done()
						select {
						case done <- struct{}{}:
						default:
						}
					}()
					d.attempt(ctx, w, c, hooks)
				}()
			}
		}
		var oldest float64
		if err := d.cfg.Pool.QueryRow(ctx, qOldestPending).Scan(&oldest); err == nil {
			d.m.oldest.Set(oldest)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-d.wake:
		case <-done: // the next of its (endpoint, rule, subject) may be due
		}
	}
}

func (d *Dispatcher) claim(ctx context.Context, limit int) ([]claimed, error) {
	rows, err := d.cfg.Pool.Query(ctx, qClaim, pgx.NamedArgs{"claim": d.cfg.Claim.Seconds(), "limit": limit})
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (claimed, error) {
		var c claimed
		err := row.Scan(&c.eventID, &c.endpoint, &c.rule, &c.subject, &c.meter, &c.typ, &c.body, &c.attempts, &c.backoffAttempts)
		return c, err
	})
}

// release gives claims back unattempted.
func (d *Dispatcher) release(ctx context.Context, cs []claimed) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	for _, c := range cs {
		_, _ = d.cfg.Pool.Exec(rctx, qRelease, c.eventID, c.endpoint)
	}
}

// attempt makes one attempt and records its outcome.
func (d *Dispatcher) attempt(ctx context.Context, w *kafka.Writer, c claimed, hooks map[string]endpointConfig) {
	kind := "webhook"
	var status int
	var err error
	if c.endpoint == KafkaEndpoint {
		kind = "kafka"
		err = d.publish(ctx, w, c)
	} else if h, ok := hooks[c.endpoint]; !ok {
		err = fmt.Errorf("no webhook %q (deleted?)", c.endpoint)
	} else {
		status, err = d.post(ctx, h, c)
	}
	if ctx.Err() != nil {
		d.release(ctx, []claimed{c}) // shutting down: not the receiver's failure
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var st *int
	if status != 0 {
		st = &status
	}
	if err == nil {
		// The latency is the database's: from when the delivery was
		// written to when its delivery is recorded (none when it was no
		// longer pending: its webhook was deleted meanwhile).
		var took float64
		err := d.cfg.Pool.QueryRow(rctx, qDelivered, pgx.NamedArgs{"id": c.eventID, "endpoint": c.endpoint, "status": st}).Scan(&took)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			d.log.Warn("alerts: delivered but not recorded; it will be delivered again with the same id", "err", err, "event", c.eventID)
			return
		}
		d.m.deliveries.WithLabelValues(kind, "delivered").Inc()
		if err == nil {
			d.m.latency.Observe(took)
		}
		return
	}
	backoff := d.backoff(c.backoffAttempts + 1)
	var state string
	msg := err.Error()
	if len(msg) > 500 {
		msg = msg[:500]
	}
	if err := d.cfg.Pool.QueryRow(rctx, qAttemptFailed, pgx.NamedArgs{"id": c.eventID, "endpoint": c.endpoint, "status": st,
		"error": msg, "backoff": backoff.Seconds()}).Scan(&state); err != nil {
		d.log.Warn("alerts: attempt not recorded; it will be made again", "err", err, "event", c.eventID)
		return
	}
	if state == "failed" {
		d.m.deliveries.WithLabelValues(kind, "failed").Inc()
		d.log.Error("alerts: delivery failed for good (redeliver with POST /v1/alert-events/{id}/redeliver)",
			"event", c.eventID, "endpoint", c.endpoint, "attempts", c.attempts+1, "err", msg)
		return
	}
	d.m.deliveries.WithLabelValues(kind, "retry").Inc()
	d.log.Warn("alerts: delivery attempt failed; retrying", "event", c.eventID, "endpoint", c.endpoint,
		"attempts", c.attempts+1, "retry_in", backoff.Round(time.Millisecond), "err", msg)
}

// backoff is the wait before attempt n+1: base × 2^(n−1), at most max,
// the upper half random (jitter).
func (d *Dispatcher) backoff(n int) time.Duration {
	b := d.cfg.BackoffBase
	for i := 1; i < n && b < d.cfg.BackoffMax; i++ {
		b *= 2
	}
	b = min(b, d.cfg.BackoffMax)
	return b/2 + rand.N(b/2+1)
}

// Sign returns the Tally-Signature header of body sent at t with secret:
// "t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>", with one
// more ",v1=<hex>" for each of older (a rotated-out secret during its
// overlap).
func Sign(secret string, t time.Time, body []byte, older ...string) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	h := "t=" + ts
	for _, s := range append([]string{secret}, older...) {
		h += ",v1=" + hex.EncodeToString(signature(s, ts, body))
	}
	return h
}

func signature(secret, ts string, body []byte) []byte {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	return mac.Sum(nil)
}

// Verify checks a Tally-Signature header against body and secret (one of
// its v1 signatures is secret's), and that its time is within tolerance of
// now.
func Verify(secret, header string, body []byte, now time.Time, tolerance time.Duration) error {
	var ts string
	var v1s []string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			v1s = append(v1s, v)
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(v1s) == 0 {
		return errors.New("alerts: malformed signature header")
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("alerts: signature time %s is %v from now", ts, d)
	}
	want := signature(secret, ts, body)
	for _, v1 := range v1s {
		if got, err := hex.DecodeString(v1); err == nil && hmac.Equal(want, got) {
			return nil
		}
	}
	return errors.New("alerts: signature does not match")
}

func (d *Dispatcher) post(ctx context.Context, h endpointConfig, c claimed) (int, error) {
	body := []byte(c.body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, strings.NewReader(c.body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "Tally-Alerts/1")
	req.Header.Set("Tally-Event-Id", c.eventID.String())
	req.Header.Set("Tally-Event-Type", c.typ)
	var older []string
	if h.previous != "" {
		older = append(older, h.previous)
	}
	req.Header.Set("Tally-Signature", Sign(h.secret, time.Now(), body, older...))
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		if resp.StatusCode >= 300 && resp.StatusCode < 400 {
			return resp.StatusCode, fmt.Errorf("answered %d; redirects are not followed", resp.StatusCode)
		}
		return resp.StatusCode, fmt.Errorf("answered %d", resp.StatusCode)
	}
	return resp.StatusCode, nil
}

func (d *Dispatcher) publish(ctx context.Context, w *kafka.Writer, c claimed) error {
	if w == nil {
		return errors.New("no Kafka brokers configured")
	}
	wctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	return w.WriteMessages(wctx, kafka.Message{Key: []byte(c.subject + "/" + c.meter), Value: []byte(c.body),
		Headers: []kafka.Header{{Key: "Tally-Event-Id", Value: []byte(c.eventID.String())}}})
}
