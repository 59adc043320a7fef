package admit_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admit"
)

const (
	logRecovered = "holder generation older than Tally's: nothing issued in this run, taking next_generation"
	logConflict  = "bypass report id already used by this holder for other bypasses (a run that lost its Dir); sent again under a new id"
	logFenced    = "holder generation refused as stale after grants were issued in this run: another process uses this holder id; not taking a newer generation"
)

func generationFile(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "generation"))
	if err != nil {
		t.Fatal(err)
	}
	num, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\t") // the generation, then its CRC-32C
	return num
}

// admitFromGrant admits until a decision comes from a grant, within the
// generous bound of eventually.
func admitFromGrant(t *testing.T, c *admit.Client, customer, meter string) {
	t.Helper()
	eventually(t, "admitting "+customer+"/"+meter+" from a grant", func() bool {
		d, err := c.Admit(context.Background(), customer, meter, 1)
		return err == nil && d.How == admit.FromGrant
	})
}

// A gateway that lost its state directory starts again at generation 1,
// below what Tally stored: it takes next_generation, keeps it on disk, and
// is served; a restart on the new directory continues above it.
func TestHolderRecoversAfterLosingDir(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000000")
	ctx := context.Background()
	d1 := t.TempDir()
	if err := os.WriteFile(filepath.Join(d1, "generation"), []byte("4\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := newClient(t, ts, "gw", d1, admit.Config{MinGrant: 1, MaxWait: 5 * time.Second})
	admitFromGrant(t, a, "acme", "tokens")
	genA := a.Generation()
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}

	d2 := t.TempDir() // the lost directory: empty
	logs := &logCount{msgs: map[string]int{}}
	b := newClient(t, ts, "gw", d2, admit.Config{MinGrant: 1, MaxWait: 5 * time.Second, Logger: slog.New(logs)})
	admitFromGrant(t, b, "acme", "tokens")
	if b.Generation() <= genA {
		t.Fatalf("recovered generation %d, not above the lost run's %d", b.Generation(), genA)
	}
	if got, want := generationFile(t, d2), b.Generation(); got != itoa(want) {
		t.Fatalf("generation file %q, want %d", got, want)
	}
	if n := logs.count(logRecovered); n != 1 {
		t.Fatalf("recovery logged %d times, want once", n)
	}
	genB := b.Generation()
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}

	again := newClient(t, ts, "gw", d2, admit.Config{MinGrant: 1, MaxWait: 5 * time.Second})
	defer again.Close(ctx)
	if again.Generation() != genB+1 {
		t.Fatalf("restart on the recovered directory at generation %d, want %d", again.Generation(), genB+1)
	}
	admitFromGrant(t, again, "acme", "tokens")
}

// Two processes share one holder id: the older one, already issued a
// grant in its run, is refused as stale once the newer one is served. It
// must stop using its generation, not jump above the newer one (the two
// would fence each other in turn): it logs why, and the newer one keeps
// being served.
func TestFencedHolderDoesNotJumpForward(t *testing.T) {
	ts := startTally(t)
	for _, m := range []string{"tokens", "images", "calls"} {
		ts.exactRule("acme", m, "1000000")
	}
	ctx := context.Background()
	logs := &logCount{msgs: map[string]int{}}
	d1 := t.TempDir()
	older := newClient(t, ts, "gw", d1, admit.Config{MinGrant: 1, MaxWait: 5 * time.Second, Logger: slog.New(logs)})
	defer older.Close(ctx)
	admitFromGrant(t, older, "acme", "tokens")

	d2 := t.TempDir()
	if err := os.WriteFile(filepath.Join(d2, "generation"), []byte("4\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	newer := newClient(t, ts, "gw", d2, admit.Config{MinGrant: 1, MaxWait: 5 * time.Second})
	defer newer.Close(ctx)
	admitFromGrant(t, newer, "acme", "tokens")

	// The older process needs a grant now: refused as stale, for good.
	for range 3 {
		d, err := older.Admit(ctx, "acme", "images", 1)
		var te *admit.TallyError
		if d.Admitted || !errors.As(err, &te) || te.Type != "urn:tally:problem:stale-generation" {
			t.Fatalf("older process asking for a grant: %+v %v", d, err)
		}
	}
	if older.Generation() != 1 || generationFile(t, d1) != "1" {
		t.Fatalf("older process moved to generation %d (file %q), want it to stay at 1",
			older.Generation(), generationFile(t, d1))
	}
	if n := logs.count(logFenced); n != 1 {
		t.Fatalf("stale generation after grants were issued logged %d times, want once", n)
	}
	if logs.count(logRecovered) != 0 {
		t.Fatal("older process took next_generation")
	}
	// Tally still stores the newer process's generation: it is served.
	admitFromGrant(t, newer, "acme", "images")
	admitFromGrant(t, newer, "acme", "calls")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// A gateway that lost its Dir while Tally was down journals its bypasses
// under report ids a lost run used for other bypasses: Tally refuses those
// as a conflict, and they are sent again under new ids, never dropped.
func TestRecoveredHolderReportsItsBypasses(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000000")
	ctx := context.Background()
	cfg := admit.Config{MinGrant: 1, MaxWait: 5 * time.Second, OnUnreachable: admit.Allow}
	bypass := func(c *admit.Client, n int) {
		t.Helper()
		ts.down.Store(true)
		for range n {
			if d, err := c.Admit(ctx, "acme", "tokens", 1); err != nil || d.How != admit.Bypass {
				t.Fatalf("admit while Tally is down: %+v %v", d, err)
			}
		}
	}
	// Another gateway's grant: the budget is listed from then on.
	other := newClient(t, ts, "other", t.TempDir(), cfg)
	admitFromGrant(t, other, "acme", "tokens")
	if err := other.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// The lost run, at generation 1: 3 bypasses reported as bypass-1-0.
	d1 := t.TempDir()
	lost := newClient(t, ts, "gw", d1, cfg)
	bypass(lost, 3)
	ts.down.Store(false)
	eventually(t, "the lost run's bypasses reported", func() bool { return ts.budget("acme", "tokens").Bypassed.Equal(decimal.NewFromInt(3)) })
	if err := lost.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d1, "generation"), []byte("5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	next := newClient(t, ts, "gw", d1, cfg) // generation 6
	admitFromGrant(t, next, "acme", "tokens")
	if err := next.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// The same holder on an empty Dir while Tally is down: generation 1
	// again, 2 bypasses journaled as bypass-1-0, and a restart.
	d2 := t.TempDir()
	first := newClient(t, ts, "gw", d2, cfg)
	bypass(first, 2)
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	logs := &logCount{msgs: map[string]int{}}
	cfg.Logger = slog.New(logs)
	c := newClient(t, ts, "gw", d2, cfg) // generation 2, below Tally's 6
	defer c.Close(ctx)
	ts.down.Store(false)
	bypassed := int64(2)
	// Until Tally's backoff is over, Admit answers by on_unreachable.
	eventually(t, "admitting from a grant", func() bool {
		d, err := c.Admit(ctx, "acme", "tokens", 1)
		if err == nil && d.How == admit.Bypass {
			bypassed++
		}
		return err == nil && d.How == admit.FromGrant
	})
	if c.Generation() != 7 {
		t.Fatalf("recovered generation %d, want 7", c.Generation())
	}
	want := decimal.NewFromInt(3 + bypassed)
	eventually(t, "the recovered run's bypasses reported", func() bool { return ts.budget("acme", "tokens").Bypassed.Equal(want) })
	if logs.count(logConflict) == 0 {
		t.Fatal("bypass report id conflict not logged")
	}
}
