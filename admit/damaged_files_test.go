package admit_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admit"
)

// listBudget has another gateway take a grant of acme's tokens: the
// budget is listed from then on.
func listBudget(t *testing.T, ts *tally) {
	t.Helper()
	other := newClient(t, ts, "other", t.TempDir(), admit.Config{MinGrant: 1})
	admitFromGrant(t, other, "acme", "tokens")
	if err := other.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// bypassWhileDown admits n bypasses of one unit each for acme's tokens
// while Tally is down, closes the client and returns its journal.
func bypassWhileDown(t *testing.T, ts *tally, dir string, n int) string {
	t.Helper()
	ctx := context.Background()
	ts.down.Store(true)
	c := newClient(t, ts, "gw", dir, admit.Config{OnUnreachable: admit.Allow, MaxWait: 5 * time.Second})
	for range n {
		if d, err := c.Admit(ctx, "acme", "tokens", 1); err != nil || d.How != admit.Bypass {
			t.Fatalf("admit while Tally is down: %+v %v", d, err)
		}
	}
	_ = c.Close(ctx) // nothing to deliver: Tally never answered
	logs, _ := filepath.Glob(filepath.Join(dir, "bypass-*.log"))
	if len(logs) != 1 {
		t.Fatalf("%d bypass journals, want one", len(logs))
	}
	return logs[0]
}

// A bit flip that leaves a bypass report parseable (a digit of an amount,
// a letter of a customer id, a digit of a time) must not be reported as
// admissions that did not happen, or hide some that did: the report is
// set aside as .damaged for an operator, and nothing of it is reported.
func TestADamagedBypassReportIsSetAside(t *testing.T) {
	for _, tc := range []struct {
		name string
		// flip damages one byte of the journal's first bypass line.
		flip func(line []byte)
	}{
		{"amount", func(line []byte) { line[len("acme\ttokens\t")] ^= 0x02 }},     // '1' → '3'
		{"customer", func(line []byte) { line[3] ^= 0x02 }},                       // "acme" → "acmg"
		{"time", func(line []byte) { line[len("acme\ttokens\t1\t")+10] ^= 0x01 }}, // a digit to another
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startTally(t)
			ts.exactRule("acme", "tokens", "1000")
			listBudget(t, ts)
			dir := t.TempDir()
			journal := bypassWhileDown(t, ts, dir, 3)
			b, err := os.ReadFile(journal)
			if err != nil {
				t.Fatal(err)
			}
			i := bytes.Index(b, []byte("acme\ttokens\t1\t"))
			if i < 0 {
				t.Fatalf("no bypass of one unit in %q", b)
			}
			tc.flip(b[i:])
			if err := os.WriteFile(journal, b, 0o600); err != nil {
				t.Fatal(err)
			}
			ts.down.Store(false)
			logs := &logCount{msgs: map[string]int{}}
			c := newClient(t, ts, "gw", dir, admit.Config{Logger: slog.New(logs)})
			defer c.Close(context.Background())
			damaged := strings.TrimSuffix(journal, ".log") + ".damaged"
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				if _, err := os.Stat(damaged); err == nil || !ts.budget("acme", "tokens").Bypassed.IsZero() {
					break
				}
			}
			if got := ts.budget("acme", "tokens").Bypassed; !got.IsZero() {
				t.Errorf("bypassed %s reported from a damaged report (3 admitted), want it set aside", got)
			}
			if _, err := os.Stat(damaged); err != nil {
				t.Errorf("the damaged report is not set aside as %s: %v", filepath.Base(damaged), err)
			}
			if logs.count(logBypassDamaged) != 1 {
				t.Errorf("%q logged %d times, want once", logBypassDamaged, logs.count(logBypassDamaged))
			}
		})
	}
}

// A journal written by an earlier version (lines without their CRC) is
// read as it is.
func TestAnEarlierVersionsBypassReportIsReported(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000")
	listBudget(t, ts)
	dir := t.TempDir()
	at := time.Now().Add(-time.Minute).UnixNano()
	line := "acme\ttokens\t2\t" + itoa(at) + "\n"
	if err := os.WriteFile(filepath.Join(dir, "bypass-1-0.pending"), []byte(line+line), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "generation"), []byte("1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, ts, "gw", dir, admit.Config{})
	defer c.Close(context.Background())
	eventually(t, "the earlier version's bypasses reported", func() bool {
		return ts.budget("acme", "tokens").Bypassed.Equal(decimal.NewFromInt(4))
	})
}

const logBypassDamaged = "bypass report damaged (a line fails its CRC-32C or does not parse); set aside for an operator, not reported"

// previousRun has a run of gw at generation 5 take a grant (Tally stores
// generation 5) and close; it returns its Dir/generation as written.
func previousRun(t *testing.T, ts *tally, dir string) []byte {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "generation"), []byte("4\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := newClient(t, ts, "gw", dir, admit.Config{MinGrant: 1, MaxWait: 5 * time.Second})
	admitFromGrant(t, a, "acme", "tokens")
	if a.Generation() != 5 {
		t.Fatalf("generation %d, want 5", a.Generation())
	}
	if err := a.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "generation"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A bit flip in Dir/generation that takes it further below Tally's
// generation than the run it follows ('5' → '1'): the next run's
// generation is refused as stale, and the existing recovery takes
// next_generation before anything is issued, or New refuses the file.
// Either way no run shares generation 5 or goes below it unnoticed.
func TestADamagedGenerationBelowTallysIsRecovered(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000000")
	dir := t.TempDir()
	b := previousRun(t, ts, dir)
	b[0] ^= 0x04 // '5' → '1'
	if err := os.WriteFile(filepath.Join(dir, "generation"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	afterDamage(t, ts, dir)
}

// A bit flip in Dir/generation one below the run it follows ('5' → '4'):
// the next run would take generation 5 again, Tally's own, which it
// accepts as current: two runs share a generation, and nothing says so.
func TestADamagedGenerationIsNotShared(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000000")
	dir := t.TempDir()
	b := previousRun(t, ts, dir)
	b[0] ^= 0x01 // '5' → '4'
	if err := os.WriteFile(filepath.Join(dir, "generation"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	afterDamage(t, ts, dir)
}

// afterDamage checks that a client on dir, whose generation file was
// damaged after a run at generation 5, either is refused by New, saying
// the file is damaged, or runs above generation 5; once refused, and the
// file moved aside as the operator does, the next New runs above 5.
func afterDamage(t *testing.T, ts *tally, dir string) {
	t.Helper()
	cfg := admit.Config{URL: ts.url, Token: ts.gatewayToken("gw"), Holder: "gw", Dir: dir, MinGrant: 1, MaxWait: 5 * time.Second}
	c, err := admit.New(cfg)
	if err != nil {
		if !strings.Contains(err.Error(), "damaged") {
			t.Fatalf("New refused a damaged generation file without saying it is damaged: %v", err)
		}
		gen := filepath.Join(dir, "generation")
		if err := os.Rename(gen, gen+".damaged"); err != nil {
			t.Fatal(err)
		}
		if c, err = admit.New(cfg); err != nil {
			t.Fatalf("New with the damaged generation file moved aside: %v", err)
		}
	}
	defer c.Close(context.Background())
	admitFromGrant(t, c, "acme", "tokens")
	if g := c.Generation(); g <= 5 {
		t.Fatalf("the run after the damage took generation %d, not above the previous run's 5", g)
	}
}

// A run that takes a generation an earlier run on the same Dir used (its
// generation file moved aside, as after damage: generation 1 again)
// journals under report ids of its own: the earlier run's bypasses, left
// undelivered, are not overwritten.
func TestAReusedGenerationKeepsEarlierBypasses(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000")
	listBudget(t, ts)
	dir := t.TempDir()
	bypassWhileDown(t, ts, dir, 3) // generation 1
	gen := filepath.Join(dir, "generation")
	if err := os.Rename(gen, gen+".damaged"); err != nil {
		t.Fatal(err)
	}
	ts.down.Store(true)
	c := newClient(t, ts, "gw", dir, admit.Config{OnUnreachable: admit.Allow, MaxWait: 5 * time.Second})
	if c.Generation() != 1 {
		t.Fatalf("generation %d, want 1 again", c.Generation())
	}
	for range 2 {
		if d, err := c.Admit(context.Background(), "acme", "tokens", 1); err != nil || d.How != admit.Bypass {
			t.Fatalf("admit while Tally is down: %+v %v", d, err)
		}
	}
	_ = c.Close(context.Background())
	ts.down.Store(false)
	c = newClient(t, ts, "gw", dir, admit.Config{})
	defer c.Close(context.Background())
	var got decimal.Decimal
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if got = ts.budget("acme", "tokens").Bypassed; got.Equal(decimal.NewFromInt(5)) {
			return
		}
	}
	t.Fatalf("bypassed %s reported, want 5 (3 by the earlier run, 2 by the one that reused its generation)", got)
}
