package cli

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// TestUsageErrorsExitTwo: every usage error — an unknown command, a flag
// or argument that is invalid, missing or in conflict with another — exits
// 2 before anything runs, with one error line naming what is wrong; help
// asked for exits 0, and an error while running exits 1.
func TestUsageErrorsExitTwo(t *testing.T) {
	t.Setenv("TALLY_ADMIN_TOKEN", "")
	t.Setenv("TALLY_KAFKA_BROKERS", "")
	t.Setenv("TALLY_GRACE", "24h")
	missing := filepath.Join(t.TempDir(), "missing.json")
	const down = "postgres://root@127.0.0.1:1/tally?sslmode=disable&connect_timeout=2"
	for _, tc := range []struct {
		args []string
		code int
		says string // in what is printed on stderr
	}{
		{[]string{"reconcile"}, 2, "give either --period or --nightly"},
		{[]string{"reconcile", "--period", "2026-10-01", "--nightly"}, 2, "give either --period or --nightly"},
		{[]string{"reconcile", "--period", "2026-13-01"}, 2, "2026-13-01"},
		{[]string{"reconcile", "--period", "current", "--format", "xml"}, 2, "--format"},
		{[]string{"reconcile", "--period", "current", "--grace", "-1h"}, 2, "grace"},
		{[]string{"reconcile", "--nightly", "--deep"}, 2, "--deep"},
		{[]string{"reconcile", "--nightly", "--customer", "acme"}, 2, "--customer"},
		{[]string{"reconcile", "--period", "current", "--bogus"}, 2, "--bogus"},
		{[]string{"reconcile", "bogus"}, 2, `unknown command "bogus" for "tally reconcile"; valid commands: accept`},
		{[]string{"reconcile", "accept", "--dead-letter", "x", "--actor", "a", "--reason", "r"}, 2, "--dead-letter"},
		{[]string{"reconcile", "accept", "--actor", "a"}, 2, "--reason"},
		{[]string{"periods", "list"}, 2, `"customer"`},
		{[]string{"periods", "close", "--customer", "a", "--period", "2026-13-01"}, 2, "2026-13-01"},
		{[]string{"periods", "list", "--customer", "a", "--grace", "-1h"}, 2, "grace"},
		{[]string{"periods", "bogus"}, 2, `unknown command "bogus" for "tally periods"; valid commands: close, list`},
		{[]string{"tokens", "create"}, 2, "customer gateway"},
		{[]string{"tokens", "create", "--customer", "a", "--gateway", "b"}, 2, "customer gateway"},
		{[]string{"tokens", "revoke"}, 2, "tokens revoke: accepts 1 arg(s), received 0"},
		{[]string{"tokens", "revoke", "not-an-id"}, 2, "not-an-id"},
		{[]string{"tokens", "list", "extra"}, 2, `tokens list takes no arguments, got "extra"`},
		{[]string{"tokens", "bogus"}, 2, `unknown command "bogus" for "tally tokens"; valid commands: create, list, revoke`},
		{[]string{"bench", "bogus"}, 2, `unknown command "bogus" for "tally bench"; valid commands: admission, chaos, enforce, failover, flood, ingest`},
		{[]string{"bench", "ingest", "--records", "0"}, 2, "--records"},
		{[]string{"bogus"}, 2, `unknown command "bogus" for "tally"`},
		{[]string{"completion", "bogus"}, 2, `unknown command "bogus" for "tally completion"; valid commands: bash, fish, powershell, zsh`},
		{[]string{"migrate", "extra-arg"}, 2, `migrate takes no arguments, got "extra-arg"`},
		{[]string{"verify"}, 2, `"expect"`},
		{[]string{"verify", "--expect", missing}, 2, missing},
		{[]string{"produce", "--faults", "fire"}, 2, `"fire"`},
		{[]string{"serve", "--ingest=false"}, 2, "nothing to run"},
		{[]string{"serve", "--api"}, 2, "TALLY_ADMIN_TOKEN"},
		{[]string{"serve", "--grace", "2d"}, 2, "--grace"},
		{[]string{"dev", "--listen", "", "--dir", filepath.Join(t.TempDir(), "dev")}, 2, `"--listen" flag: must not be empty`},
		// Checked before the database is opened (down): what the
		// components would find later, with their own field names.
		{[]string{"serve", "--ingest", "--database-url", down}, 2, "--kafka-brokers (TALLY_KAFKA_BROKERS) names no broker"},
		{[]string{"serve", "--enforce", "--kafka-brokers", " , ", "--database-url", down}, 2, "--kafka-brokers"},
		{[]string{"serve", "--ingest", "--kafka-brokers", "k:9092", "--heartbeat-interval", "10s", "--database-url", down}, 2, "--heartbeat-interval"},
		{[]string{"serve", "--ingest", "--kafka-brokers", "k:9092", "--session-timeout", "-1s", "--database-url", down}, 2, "--session-timeout"},
		{[]string{"serve", "--api", "--admin-token", strings.Repeat("x", 32), "--api-body-timeout", "-1s", "--database-url", down}, 2, "--api-body-timeout"},
		// An id that is not one is the flag's fault, named as the user gave it.
		{[]string{"tokens", "create", "--gateway", "", "--database-url", down}, 2, "--gateway"},
		{[]string{"tokens", "create", "--customer", "bad id", "--database-url", down}, 2, "--customer"},
		{[]string{"tokens", "create", "--customer", "acme", "--description", strings.Repeat("d", 201), "--database-url", down}, 2, "--description"},
		// An empty --customer is not "every customer".
		{[]string{"reconcile", "--period", "previous", "--customer", "", "--close", "--database-url", down}, 2, "--customer"},
		{[]string{"periods", "list", "--customer", "", "--database-url", down}, 2, "--customer"},
		{[]string{"periods", "close", "--customer", "a b", "--database-url", down}, 2, "--customer"},
		{[]string{"periods", "close", "--customer", "a", "--force", "--actor", "alice", "--database-url", down}, 2, "--force needs --reason and --actor"},
		{[]string{"tokens", "list", "--customer", "", "--database-url", down}, 2, "--customer"},

		{nil, 0, ""},
		{[]string{"tokens"}, 0, ""},
		{[]string{"bench"}, 0, ""},
		{[]string{"reconcile", "--help"}, 0, ""},
		{[]string{"migrate", "--database-url", down}, 1, "database"},
	} {
		var out, errOut bytes.Buffer
		code := execute(t.Context(), tc.args, &out, &errOut)
		stderr := errOut.String()
		if code != tc.code {
			t.Errorf("tally %s: exit %d, want %d; stderr:\n%s", strings.Join(tc.args, " "), code, tc.code, stderr)
			continue
		}
		if tc.code == 0 {
			if stderr != "" || !strings.Contains(out.String(), "Usage:") {
				t.Errorf("tally %s: want help on stdout and nothing on stderr; got stderr %q", strings.Join(tc.args, " "), stderr)
			}
			continue
		}
		if !strings.Contains(stderr, tc.says) {
			t.Errorf("tally %s: stderr does not say %q:\n%s", strings.Join(tc.args, " "), tc.says, stderr)
		}
		if n := strings.Count(stderr, "tally:"); n != 1 || out.Len() != 0 && tc.code == 2 {
			t.Errorf("tally %s: want one error line and nothing on stdout; got stderr\n%s\nstdout\n%s", strings.Join(tc.args, " "), stderr, out.String())
		}
	}
}

// TestProduceRefusesNonPositiveCounts: the scenario takes 0 for its
// defaults, so on the command line (whose defaults are the flags') a 0 or
// a negative count would silently run with the default: it is a usage
// error naming the flag.
func TestProduceRefusesNonPositiveCounts(t *testing.T) {
	for _, args := range [][]string{
		{"--customers", "0"}, {"--producers", "0"}, {"--workers", "0"}, {"--meters", "0"},
		{"--customers", "-1"}, {"--linger", "0s"}, {"--duration", "0s"},
	} {
		var out, errOut bytes.Buffer
		code := execute(t.Context(), append([]string{"produce", "--kafka-brokers", "127.0.0.1:1"}, args...), &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), args[0]) {
			t.Errorf("produce %s: exit %d, want 2 naming %s; stderr:\n%s", strings.Join(args, " "), code, args[0], errOut.String())
		}
	}
}
