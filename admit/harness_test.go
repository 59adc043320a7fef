package admit_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shopspring/decimal"
	"go.uber.org/goleak"

	"github.com/tally-ledger/tally/admission"
	"github.com/tally-ledger/tally/admit"
	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/internal/ledgertest"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/internal/testrun"
	"github.com/tally-ledger/tally/ledger"
	"github.com/tally-ledger/tally/periods"
	"github.com/tally-ledger/tally/quota"
	"github.com/tally-ledger/tally/tokens"
)

func TestMain(m *testing.M) {
	code := m.Run()
	removeTallyBinary()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

const adminToken = "admit-test-admin-token-0123456789abcdef"

// tally is a real Tally API over loopback whose process can be "killed":
// while down, every connection is cut before an answer.
type tally struct {
	t    testing.TB
	pool *pgxpool.Pool
	srv  *httptest.Server // nil for a tally serve process
	url  string
	down atomic.Bool
	// refuse, when set, answers a request with its status (429 or 503,
	// Retry-After: 1) instead of serving it, when it returns one.
	refuse atomic.Pointer[func(*http.Request) int]
	// changing, when set, answers a grant request whose body it returns
	// true for as the API answers one whose budgets kept changing (503
	// budgets-changing, Retry-After: 1).
	changing atomic.Pointer[func(body []byte) bool]
	// served, when set, is told each request served and its status.
	served atomic.Pointer[func(*http.Request, int)]
	// cal is the billing calendar of every customer given a rule or
	// usage: no period of it ends while the test runs
	// (ledgertest.SteadyCalendar).
	cal periods.Calendar
}

// statusWriter remembers the status written.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func startTally(t testing.TB) *tally {
	t.Helper()
	pool := pgtest.New(t)
	l, err := ledger.New(ledger.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := api.New(api.Config{Pool: pool, Ledger: l, AdminToken: adminToken,
		Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	ts := &tally{t: t, pool: pool, cal: ledgertest.SteadyCalendar(time.Now())}
	ts.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ts.down.Load() {
			panic(http.ErrAbortHandler) // the connection dies without an answer
		}
		if refuse := ts.refuse.Load(); refuse != nil {
			if code := (*refuse)(r); code != 0 {
				w.Header().Set("Retry-After", "1")
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(code)
				_, _ = w.Write([]byte(`{"type":"urn:tally:problem:overloaded","title":"Too many requests","status":` + strconv.Itoa(code) + `}`))
				return
			}
		}
		if changing := ts.changing.Load(); changing != nil && r.URL.Path == "/v1/grants" {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				panic(http.ErrAbortHandler)
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			if (*changing)(body) {
				w.Header().Set("Retry-After", "1")
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(`{"type":"` + api.TypeBudgetsChanging + `","title":"Budgets changing","status":503}`))
				return
			}
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(sw, r)
		if served := ts.served.Load(); served != nil {
			(*served)(r, sw.status)
		}
	}))
	t.Cleanup(ts.srv.Close)
	ts.url = ts.srv.URL
	return ts
}

// customer gives customer ts.cal from the beginning; it fails the test
// when something referred to the customer first (ts.cal would then only
// be pending, from a boundary of the default calendar on).
func (ts *tally) customer(customer string) {
	ts.t.Helper()
	c, _, err := (periods.Store{}).SetCalendar(context.Background(), ts.pool, customer, ts.cal)
	if err != nil {
		ts.t.Fatal(err)
	}
	if len(c.Schedule) != 1 || c.Schedule[0].Calendar != ts.cal || !c.Schedule[0].EffectiveFrom.IsZero() {
		ts.t.Fatalf("customer %s has calendars %+v, want only %+v from the beginning", customer, c.Schedule, ts.cal)
	}
}

func (ts *tally) exactRule(customer, meter, limit string) {
	ts.t.Helper()
	ts.customer(customer)
	_, err := quota.PutRuleDB(context.Background(), ts.pool, quota.RuleInput{Customer: customer, Meter: meter,
		Limit: decimal.RequireFromString(limit), Admission: quota.Exact, Actor: "test"})
	if err != nil {
		ts.t.Fatal(err)
	}
}

// exactRuleWith stores an exact rule with on_unreachable policy (local: 7
// per hour).
func (ts *tally) exactRuleWith(customer, meter, limit string, policy admit.Policy) {
	ts.t.Helper()
	ts.customer(customer)
	in := quota.RuleInput{Customer: customer, Meter: meter, Limit: decimal.RequireFromString(limit),
		Admission: quota.Exact, OnUnreachable: quota.OnUnreachable(policy), Actor: "test"}
	if policy == admit.Local {
		in.LocalAmount, in.LocalEvery = decimal.NewNullDecimal(decimal.NewFromInt(7)), time.Hour
	}
	if _, err := quota.PutRuleDB(context.Background(), ts.pool, in); err != nil {
		ts.t.Fatal(err)
	}
}

func (ts *tally) gatewayToken(holder string) string {
	ts.t.Helper()
	_, secret, err := tokens.CreateGateway(context.Background(), ts.pool, holder, "test", time.Now())
	if err != nil {
		ts.t.Fatal(err)
	}
	return secret
}

func (ts *tally) budget(customer, meter string) admission.Budget {
	ts.t.Helper()
	s, err := admission.New(ts.pool, admission.Config{})
	if err != nil {
		ts.t.Fatal(err)
	}
	bs, err := s.Budgets(context.Background(), customer)
	if err != nil {
		ts.t.Fatal(err)
	}
	for _, b := range bs {
		if b.Meter == meter {
			return b
		}
	}
	return admission.Budget{}
}

// eventually polls cond for up to a generous minute (the machine may be
// loaded): it asserts behaviour, not speed.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

const ingestTopic = "tally.meter-batches"

// pipeline is the lagged side of a Tally: a Kafka-protocol cluster (kfake)
// and a real quota enforcer publishing decisions to it from the same
// Postgres as ts's API.
type pipeline struct {
	ts      *tally
	brokers []string
	streams *ledgertest.Streams
	enf     *testrun.Service
}

func (ts *tally) startPipeline() *pipeline {
	ts.t.Helper()
	k := kafkatest.New(ts.t, kafkatest.Options{Topics: []kafkatest.Topic{
		{Name: quota.DefaultTopic, Partitions: 2}, {Name: ingestTopic, Partitions: 2}}})
	l, err := ledger.New(ledger.Config{})
	if err != nil {
		ts.t.Fatal(err)
	}
	p := &pipeline{ts: ts, brokers: k.Addrs, streams: ledgertest.New(ts.pool, l)}
	reg := prometheus.NewRegistry()
	enf, err := quota.NewEnforcer(quota.Config{Pool: ts.pool, Brokers: k.Addrs, IngestTopic: ingestTopic,
		Interval: 50 * time.Millisecond, Republish: 2 * time.Second, LeaseTTL: time.Second,
		Logger: slog.New(slog.DiscardHandler), Registerer: reg})
	if err != nil {
		ts.t.Fatal(err)
	}
	p.enf = testrun.Start(ts.t, reg, enf.Run)
	return p
}

// use applies qty of usage of customer and meter to the ledger, as ingest
// would, at an instant of the period now is in (ledgertest.Recent).
func (p *pipeline) use(customer, meter string, qty int64) {
	p.ts.t.Helper()
	p.ts.customer(customer)
	p.streams.Use(p.ts.t, customer, meter, ledgertest.Recent(time.Now()), decimal.NewFromInt(qty))
}

// position says ingest has applied everything through at, on every
// partition of the meter topic (the as_of of the decisions).
func (p *pipeline) position(at time.Time) {
	p.ts.t.Helper()
	ledgertest.Position(p.ts.t, p.ts.pool, ingestTopic, 2, at)
}

// follow keeps the ingest position at now (a caught-up ingest) until the
// test ends.
func (p *pipeline) follow() { ledgertest.Follow(p.ts.t, p.ts.pool, ingestTopic, 2, time.Now) }

func (ts *tally) rule(in quota.RuleInput) {
	ts.t.Helper()
	ts.customer(in.Customer)
	in.Actor = "test"
	if _, err := quota.PutRuleDB(context.Background(), ts.pool, in); err != nil {
		ts.t.Fatal(err)
	}
}
