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

	"github.com/tally-ledger/tally/admit"
)

const (
	logRecovered = "holder generation older than Tally's: nothing issued in this run, taking next_generation"
	logFenced    = "holder generation refused as stale after grants were issued in this run: another process uses this holder id; not taking a newer generation"
)

func generationFile(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "generation"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
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
	if logs.count(logFenced) == 0 {
		t.Fatal("stale generation after grants were issued not logged")
	}
	if logs.count(logRecovered) != 0 {
		t.Fatal("older process took next_generation")
	}
	// Tally still stores the newer process's generation: it is served.
	admitFromGrant(t, newer, "acme", "images")
	admitFromGrant(t, newer, "acme", "calls")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
