package admit_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tally-ledger/tally/admit"
	"github.com/tally-ledger/tally/tokens"
	"github.com/tally-ledger/tally/validation"
)

// Setup mistakes are refused at New, every one at once, each naming its
// Config field: not later as Admit errors or as an outage.
func TestNewRefusesSetupMistakes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    admit.Config
		fields []string
	}{
		{"empty", admit.Config{}, []string{"URL", "Token", "Holder", "Dir"}},
		{"no scheme", admit.Config{URL: "127.0.0.1:8080", Token: "t", Holder: "gw1", Dir: "d"}, []string{"URL"}},
		{"no host", admit.Config{URL: "http://", Token: "t", Holder: "gw1", Dir: "d"}, []string{"URL"}},
		{"token with a newline", admit.Config{URL: "http://h:1", Token: "t\n", Holder: "gw1", Dir: "d"}, []string{"Token"}},
		{"holder", admit.Config{URL: "http://h:1", Token: "t", Holder: "gw 1", Dir: "d"}, []string{"Holder"}},
		{"negative", admit.Config{URL: "http://h:1", Token: "t", Holder: "gw1", Dir: "d", MaxWait: -time.Second}, []string{"MaxWait"}},
		{"grant ttl finer than a microsecond", admit.Config{URL: "http://h:1", Token: "t", Holder: "gw1", Dir: "d", GrantTTL: 30*time.Second + time.Nanosecond}, []string{"GrantTTL"}},
		{"grant ttl above an hour", admit.Config{URL: "http://h:1", Token: "t", Holder: "gw1", Dir: "d", GrantTTL: 2 * time.Hour}, []string{"GrantTTL"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := admit.New(tc.cfg)
			var got []string
			for _, fe := range validation.Fields(err) {
				got = append(got, fe.Field)
			}
			if !slices.Equal(got, tc.fields) {
				t.Fatalf("New: %v; fields %v, want %v", err, got, tc.fields)
			}
		})
	}
}

// Every URL without an http or https scheme is told the one thing that is
// wrong and how to write it, whatever Go's URL parser makes of it (a host
// and port alone do not parse; "ftp://x" has another scheme).
func TestURLWithoutSchemeIsToldHowToWriteIt(t *testing.T) {
	for _, tc := range []struct{ url, example string }{
		{"127.0.0.1:18082", "http://127.0.0.1:18082"},
		{"localhost:18082", "http://localhost:18082"},
		{"tally", "http://tally"},
		{"[::1]:8080", "http://[::1]:8080"},
		{"//tally:8080", "http://tally:8080"},
		{"ftp://x", "http://x"},
		{"tcp://127.0.0.1:8080", "http://127.0.0.1:8080"},
	} {
		err := admit.Config{URL: tc.url, Token: "t", Holder: "gw1", Dir: "d"}.Validate()
		want := fmt.Sprintf("URL: %q needs a scheme, http:// or https:// (e.g. %q)", tc.url, tc.example)
		if err == nil || err.Error() != want {
			t.Errorf("URL %q: %v, want %s", tc.url, err, want)
		}
	}
	for _, ok := range []string{"http://127.0.0.1:8080", "https://tally.example", "HTTP://tally:8080"} {
		if err := (admit.Config{URL: ok, Token: "t", Holder: "gw1", Dir: "d"}).Validate(); err != nil {
			t.Errorf("URL %q: %v, want valid", ok, err)
		}
	}
}

// A trailing slash on URL is dropped: grants work.
func TestURLWithTrailingSlash(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "100")
	c, err := admit.New(admit.Config{URL: ts.url + "/", Token: ts.gatewayToken("gw1"), Holder: "gw1", Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if d, err := c.Admit(context.Background(), "acme", "tokens", 1); err != nil || d.How != admit.FromGrant {
		t.Fatalf("admit: %+v %v", d, err)
	}
}

// Check reaches Tally with the token and says precisely what is wrong.
func TestCheckSaysWhatIsWrong(t *testing.T) {
	ts := startTally(t)
	ctx := context.Background()
	gw1 := ts.gatewayToken("gw1")
	ts.customer("acme") // before its token creates it
	_, customer, err := tokens.Create(ctx, ts.pool, "acme", "test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nothing := "http://" + l.Addr().String()
	l.Close()
	for _, tc := range []struct {
		name, url, token, holder, problem string
	}{
		{"good", ts.url, gw1, "gw1", ""},
		{"admin token", ts.url, adminToken, "gw1", ""},
		{"nothing listening", nothing, gw1, "gw1", "unreachable"},
		{"not the API", ts.url + "/v1", gw1, "gw1", "not-tally"},
		{"unknown token", ts.url, "no-such-token", "gw1", "unknown-token"},
		{"customer token", ts.url, customer, "gw1", "wrong-token-kind"},
		{"another holder", ts.url, gw1, "gw2", "holder-not-allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := admit.Check(ctx, admit.Config{URL: tc.url, Token: tc.token, Holder: tc.holder, Dir: "unused"})
			var ce *admit.CheckError
			switch {
			case tc.problem == "" && err != nil:
				t.Fatalf("check: %v", err)
			case tc.problem != "" && (!errors.As(err, &ce) || ce.Problem != tc.problem):
				t.Fatalf("check: %v, want problem %s", err, tc.problem)
			}
			if ce != nil && !strings.Contains(ce.Error(), "gw") && tc.problem != "unreachable" && tc.problem != "not-tally" {
				t.Fatalf("check does not say which holder: %v", ce)
			}
		})
	}
	// A wrong token is also an Admit error, never an outage.
	ts.exactRule("acme", "tokens", "100")
	c, err := admit.New(admit.Config{URL: ts.url, Token: customer, Holder: "gw1", Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var te *admit.TallyError
	if d, err := c.Admit(ctx, "acme", "tokens", 1); !errors.As(err, &te) || te.Status != 403 || d.Unreachable {
		t.Fatalf("admit with a customer token: %+v %v", d, err)
	}
}

// The client's metrics land on the registry its Config names.
func TestMetricsOnTheCallersRegistry(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "5")
	reg := prometheus.NewRegistry()
	c := newClient(t, ts, "gw1", t.TempDir(), admit.Config{Registerer: reg, MinGrant: 5})
	ctx := context.Background()
	for range 8 {
		if _, err := c.Admit(ctx, "acme", "tokens", 1); err != nil {
			t.Fatal(err)
		}
	}
	// The spent grant goes back a second after it was found spent: read
	// the metrics then, since Close takes them off the registry.
	eventually(t, "the spent grant's report delivered", func() bool {
		v, err := metricValue(reg, "tally_admit_spend_reports_total", `result="delivered"`)
		return err == nil && v == 1
	})
	for _, want := range []struct {
		name, labels string
		value        float64
	}{
		{"tally_admit_admissions_total", `how="grant",outcome="admitted"`, 5},
		{"tally_admit_admissions_total", `how="exhausted",outcome="refused"`, 3},
		{"tally_admit_grant_calls_total", `call="issue",result="ok"`, 1},
		{"tally_admit_spend_reports_total", `result="delivered"`, 1},
		{"tally_admit_spend_reports_undelivered", ``, 0},
		{"tally_admit_tally_reachable", ``, 1},
	} {
		got, err := metricValue(reg, want.name, want.labels)
		if err != nil || got != want.value {
			t.Errorf("%s{%s} = %v (%v), want %v", want.name, want.labels, got, err, want.value)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(mfs, func(mf *dto.MetricFamily) bool {
		return mf.GetName() == "tally_admit_grant_call_seconds" && mf.GetMetric()[0].GetHistogram().GetSampleCount() > 0
	}) {
		t.Error("no grant call latency")
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if mfs, err = reg.Gather(); err != nil || len(mfs) != 0 {
		t.Errorf("after Close the registry still gathers %d families (%v), want none", len(mfs), err)
	}
}

// Close takes the client's metrics off its registry, so a gateway that
// closes its client and makes a new one (a reload) registers it on the
// same registry.
func TestANewClientAfterCloseOnTheSameRegistry(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "100")
	reg := prometheus.NewRegistry()
	ctx := context.Background()
	dir := t.TempDir()
	for run := range 2 {
		c := newClient(t, ts, "gw1", dir, admit.Config{Registerer: reg})
		if d, err := c.Admit(ctx, "acme", "tokens", 1); err != nil || !d.Admitted {
			t.Fatalf("run %d: admit: %+v %v", run, d, err)
		}
		if got, err := metricValue(reg, "tally_admit_admissions_total", `how="grant",outcome="admitted"`); err != nil || got != 1 {
			t.Errorf("run %d: admitted from grants %v (%v), want this client's 1", run, got, err)
		}
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A New refused because its registry already holds a client's metrics
// has no effect on Dir: the holder's generation is not moved.
func TestNewRefusedForItsRegistryLeavesTheGeneration(t *testing.T) {
	ts := startTally(t)
	reg := prometheus.NewRegistry()
	first := newClient(t, ts, "gw1", t.TempDir(), admit.Config{Registerer: reg})
	defer first.Close(context.Background())
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "generation"), []byte("4\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := admit.New(admit.Config{URL: ts.url, Token: "tly_x", Holder: "gw2", Dir: dir, Registerer: reg})
	if err == nil {
		c.Close(context.Background())
		t.Fatal("New on a registry that holds another client's metrics succeeded")
	}
	if !strings.Contains(err.Error(), "metrics") {
		t.Errorf("New: %v, want a metrics error", err)
	}
	if got := generationFile(t, dir); got != "4" {
		t.Errorf("generation file %q after a refused New, want 4 (unchanged)", got)
	}
}

// metricValue reads one series of a gathered metric, labels written as
// in the text format.
func metricValue(reg *prometheus.Registry, name, labels string) (float64, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+`="`+l.GetValue()+`"`)
			}
			if strings.Join(ls, ",") != labels {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue(), nil
			case m.Gauge != nil:
				return m.GetGauge().GetValue(), nil
			}
		}
	}
	return 0, errors.New("no such series")
}
