package cli

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"go.uber.org/goleak"

	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/internal/pgtest"
	"github.com/tally-ledger/tally/internal/testrun"
)

// tally dev migrates an empty database, starts the embedded broker, prints
// where to send batches, bills a batch sent three times once, and stops
// cleanly.
func TestDevEndToEnd(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	db := pgtest.NewEmptyURL(t)
	t.Setenv("TALLY_DATABASE_URL", db)
	t.Setenv("TALLY_KAFKA_BROKERS", "")
	dir := t.TempDir()

	var out testrun.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		root := newRoot()
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs([]string{"dev", "--dir", dir, "--kafka-addr", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--grant-max-skew", "7s"})
		done <- root.ExecuteContext(ctx)
	}()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("tally dev: %v\n%s", err, out.String())
			}
		case <-time.After(30 * time.Second):
			t.Error("tally dev did not stop within 30s")
		}
	}
	defer stop()

	broker := regexp.MustCompile(`kcat -P -b (127\.0\.0\.1:\d+) -t tally\.meter-batches`)
	var addr string
	for deadline := time.Now().Add(30 * time.Second); addr == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m := broker.FindStringSubmatch(out.String()); m != nil {
			addr = m[1]
		}
	}
	if addr == "" {
		t.Fatalf("no kcat line in the banner:\n%s", out.String())
	}
	if _, err := os.Stat(dir + "/kafka"); err != nil {
		t.Errorf("no broker data directory: %v", err)
	}
	sample, err := readSample("valid-spec-example.json")
	if err != nil {
		t.Fatal(err)
	}
	w := kafkatest.NewWriter([]string{addr}, "tally.meter-batches")
	msg := kafka.Message{Key: []byte("acme"), Value: sample}
	wctx, wcancel := context.WithTimeout(context.Background(), 20*time.Second)
	err = w.WriteMessages(wctx, msg, msg, msg)
	wcancel()
	w.Close()
	if err != nil {
		t.Fatal(err)
	}

	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	// The simulated producers run too: look only at acme, and at the
	// counters of duplicates, which only the resent sample makes.
	var dups, records int
	var billed string
	for deadline := time.Now().Add(30 * time.Second); dups < 2 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		_ = conn.QueryRow(context.Background(), "SELECT coalesce(sum(records_duplicate), 0) FROM ingest_partitions").Scan(&dups)
	}
	if err := conn.QueryRow(context.Background(), "SELECT count(*), coalesce(sum(billed), 0)::text FROM records WHERE customer = 'acme'").Scan(&records, &billed); err != nil {
		t.Fatal(err)
	}
	if dups != 2 || records != 1 || billed != "1234567" {
		t.Errorf("sent 3 times: %d duplicates, %d in the ledger billing %s; want 2, 1 and 1234567", dups, records, billed)
	}

	// The REST API answers with the admin token the banner printed.
	tok := regexp.MustCompile(`export TALLY_ADMIN_TOKEN=(\S+)`).FindStringSubmatch(out.String())
	api := regexp.MustCompile(`REST API  http://(127\.0\.0\.1:\d+)/v1`).FindStringSubmatch(out.String())
	if tok == nil || api == nil {
		t.Fatalf("no admin token or API address in the banner:\n%s", out.String())
	}
	// So that tally reconcile, tokens and verify reach the dev database.
	shown := regexp.MustCompile(`Postgres  (\S+)`).FindStringSubmatch(out.String())
	export := regexp.MustCompile(`export TALLY_DATABASE_URL='([^']+)'`).FindStringSubmatch(out.String())
	if shown == nil || export == nil || export[1] != shown[1] {
		t.Errorf("the banner's TALLY_DATABASE_URL export is not its Postgres URL (%v, %v):\n%s", shown, export, out.String())
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+api[1]+"/v1/customers/acme/usage?meter=api_calls&period=2026-12-01", nil)
	req.Header.Set("Authorization", "Bearer "+tok[1])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"total":"1234567"`) {
		t.Errorf("usage over REST: %d %s", resp.StatusCode, body)
	}

	// The banner's console URL serves the sign-in page.
	console := regexp.MustCompile(`Console   (http://127\.0\.0\.1:\d+/console/)`).FindStringSubmatch(out.String())
	if console == nil {
		t.Fatalf("no console URL in the banner:\n%s", out.String())
	}
	resp, err = http.Get(console[1])
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "Sign in to Tally") {
		t.Errorf("console: %d %s", resp.StatusCode, body)
	}

	// And the simulated producers' usage reaches the ledger.
	var simulated int
	for deadline := time.Now().Add(30 * time.Second); simulated == 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		_ = conn.QueryRow(context.Background(), "SELECT count(*) FROM records WHERE customer = 'demo-acme'").Scan(&simulated)
	}
	if simulated == 0 {
		t.Errorf("no simulated usage for demo-acme in the ledger")
	}

	// The two demo gateways hold grants of demo-initech's exact budget,
	// visible with the curl the banner prints, reclaimed --grant-max-skew
	// after valid_until.
	curl := regexp.MustCompile(`curl -s -H "Authorization: Bearer \$TALLY_ADMIN_TOKEN" 'http://` + regexp.QuoteMeta(api[1]) +
		`(/v1/customers/demo-initech/grants\?state=live)'`).FindStringSubmatch(out.String())
	if curl == nil {
		t.Fatalf("no curl for the demo gateways' grants in the banner:\n%s", out.String())
	}
	holders := map[string]bool{}
	for deadline := time.Now().Add(60 * time.Second); len(holders) < 2 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+api[1]+curl[1], nil)
		req.Header.Set("Authorization", "Bearer "+tok[1])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var page struct {
			Items []struct {
				Holder     string    `json:"holder"`
				ValidUntil time.Time `json:"valid_until"`
				ReclaimAt  time.Time `json:"reclaim_at"`
			} `json:"items"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("grants over REST: %d %v", resp.StatusCode, err)
		}
		for _, g := range page.Items {
			holders[g.Holder] = true
			if skew := g.ReclaimAt.Sub(g.ValidUntil); skew != 7*time.Second {
				t.Fatalf("grant of %s reclaimed %s after valid_until, want --grant-max-skew 7s", g.Holder, skew)
			}
		}
	}
	if !holders["demo-gateway-1"] || !holders["demo-gateway-2"] {
		t.Errorf("live grants of demo-initech held by %v, want both demo gateways", holders)
	}
	stop()
}
