package cli

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tally-ledger/tally/internal/faultproxy"
	"github.com/tally-ledger/tally/internal/kafkatest"
	"github.com/tally-ledger/tally/internal/pgtest"
)

// tally serve --ingest serves /readyz: ready once it holds its partition
// leases, 503 saying why while its database is unreachable, ready again once
// the database is back.
func TestServeIngestAnswersReadyz(t *testing.T) {
	db := pgtest.NewURL(t)
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	u.Host = proxy.Addr()
	q := u.Query()
	q.Set("connect_timeout", "1")
	u.RawQuery = q.Encode()
	k := kafkatest.New(t, kafkatest.Options{Topics: []kafkatest.Topic{{Name: "tally.meter-batches", Partitions: 2}}})
	addr, stop := startServe(t, "--ingest", "--database-url", u.String(), "--kafka-brokers", strings.Join(k.Addrs, ","),
		"--session-timeout", "1500ms", "--heartbeat-interval", "100ms")
	defer func() {
		proxy.Pass()
		if err := stop(); err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	readyz := func() (int, string) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waitFor := func(what string, ok func(int, string) bool) {
		t.Helper()
		var status int
		var body string
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if status, body = readyz(); ok(status, body) {
				return
			}
		}
		t.Fatalf("/readyz never %s: last %d %s", what, status, body)
	}
	waitFor("ready", func(s int, b string) bool { return s == 200 && strings.Contains(b, `"ready"`) })

	proxy.Reset()
	waitFor("503 naming the database", func(s int, b string) bool {
		return s == 503 && strings.Contains(b, "urn:tally:problem:not-ready") && strings.Contains(b, "postgres")
	})
	proxy.Pass()
	waitFor("ready again", func(s int, b string) bool { return s == 200 })
}

// While the topic's partitions cannot be read, /readyz says why (the
// connection refused), not only that they are unknown, and names nothing
// of the deployment (anyone may ask: the addresses are in the log).
func TestServeIngestReadyzSaysWhyKafkaIsNotRead(t *testing.T) {
	addr, stop := startServe(t, "--ingest", "--database-url", pgtest.NewURL(t), "--kafka-brokers", "127.0.0.1:1",
		"--session-timeout", "1500ms", "--heartbeat-interval", "100ms")
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	var body string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if body = string(b); resp.StatusCode == 503 && strings.Contains(body, "connection was refused") {
			if strings.Contains(body, "127.0.0.1") {
				t.Fatalf("/readyz names the broker's address: %s", body)
			}
			return
		}
	}
	t.Fatalf("/readyz never named the cause: last %s", body)
}

// startServe runs tally serve with args and --listen on a free address
// until the returned stop is called; stop returns what serve returned, or
// an error when it did not stop within 60 s of being told to (a loaded
// machine's API under load included).
func startServe(t *testing.T, args ...string) (addr string, stop func() error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr = ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		root := newRoot()
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		root.SetArgs(append(append([]string{"serve"}, args...), "--listen", addr))
		done <- root.ExecuteContext(ctx)
	}()
	return addr, func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(60 * time.Second):
			return errors.New("serve did not stop within 60s of its context ending")
		}
	}
}
