package admit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/admit"
	"github.com/tally-ledger/tally/tokens"
)

// Final spend reports kept while Tally was down go back in one call
// (POST /v1/grants/release) once it answers again, and each frees its own
// grant's unspent part: Tally's consumed ends at exactly what was admitted.
func TestKeptReportsGoBackInOneCall(t *testing.T) {
	ts := startTally(t)
	customers := []string{"acme", "globex", "initech"}
	for _, c := range customers {
		ts.exactRule(c, "tokens", "1000")
	}
	ctx := context.Background()
	dir := t.TempDir()
	cfg := admit.Config{MinGrant: 20}
	// No tick in the first run: its loop gives back nothing on its own
	// while Tally is down (a loaded machine ran several ticks there, each
	// keeping a file of its own), so every report kept is Close's.
	quiet := cfg
	quiet.Tick = time.Hour
	c := newClient(t, ts, "gw1", dir, quiet)
	for _, cu := range customers {
		if d, err := c.Admit(ctx, cu, "tokens", 1); err != nil || !d.Admitted || d.How != admit.FromGrant {
			t.Fatalf("admit %s: %+v %v", cu, d, err)
		}
	}
	ts.down.Store(true)
	var und *admit.UndeliveredError
	// The three grants' reports, three units spent in all.
	if err := c.Close(ctx); !errors.As(err, &und) || und.Reports != 3 || und.Spent != 3 {
		t.Fatalf("close while Tally is down: %v, want the three grants' final spend reports undelivered", err)
	}
	// Kept together: one file, written and fsynced once.
	if kept, _ := filepath.Glob(filepath.Join(dir, "spend-*.json")); len(kept) != 1 {
		t.Fatalf("final spend reports kept in %d files, want them together", len(kept))
	}
	var mu sync.Mutex
	var releases []string
	record := func(r *http.Request) int {
		if strings.HasSuffix(r.URL.Path, "/release") {
			mu.Lock()
			releases = append(releases, r.URL.Path)
			mu.Unlock()
		}
		return 0
	}
	ts.refuse.Store(&record)
	ts.down.Store(false)
	c = newClient(t, ts, "gw1", dir, cfg)
	defer c.Close(ctx)
	eventually(t, "the kept reports delivered", func() bool {
		for _, cu := range customers {
			if b := ts.budget(cu, "tokens"); !b.Consumed.Equal(decimal.NewFromInt(1)) || !b.Live.IsZero() {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	if len(releases) != 1 || releases[0] != "/v1/grants/release" {
		t.Fatalf("releases sent as %q, want one POST /v1/grants/release", releases)
	}
}

// A kept report Tally cannot read (its grant id is not one) makes a call
// of several invalid as a whole: they are sent again one per call, so the
// others are delivered and only that one is set aside.
func TestAnUnreadableReportDoesNotHoldBackTheOthers(t *testing.T) {
	ts := startTally(t)
	customers := []string{"acme", "globex"}
	ctx := context.Background()
	cfg := admit.Config{MinGrant: 20}
	dir := keptWhileDown(t, ts, cfg, customers)
	bogus := filepath.Join(dir, "spend-bogus.json")
	if err := os.WriteFile(bogus, []byte(`{"grant":"bogus","holder":"gw1","generation":1,"customer":"acme","meter":"tokens","spent":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	ts.down.Store(false)
	c := newClient(t, ts, "gw1", dir, cfg)
	defer c.Close(ctx)
	eventually(t, "the readable reports delivered", func() bool {
		for _, cu := range customers {
			if b := ts.budget(cu, "tokens"); !b.Consumed.Equal(decimal.NewFromInt(1)) || !b.Live.IsZero() {
				return false
			}
		}
		return true
	})
	eventually(t, "the unreadable one set aside", func() bool {
		_, err := os.Stat(filepath.Join(dir, "spend-bogus.rejected"))
		return err == nil
	})
}

// The reports kept in one file are settled one by one: those Tally takes
// are done, one it can never take is set aside in a file of its own, and
// nothing of the kept file is left.
func TestReportsKeptTogetherSettleOneByOne(t *testing.T) {
	ts := startTally(t)
	customers := []string{"acme", "globex"}
	ctx := context.Background()
	dir := keptWhileDown(t, ts, admit.Config{MinGrant: 20, Tick: time.Hour}, customers) // nothing given back before Close
	kept, _ := filepath.Glob(filepath.Join(dir, "spend-*.json"))
	if len(kept) != 1 {
		t.Fatalf("kept in %d files, want one", len(kept))
	}
	var reports []map[string]any
	b, err := os.ReadFile(kept[0])
	if err == nil {
		err = json.Unmarshal(keptJSON(b), &reports)
	}
	if err != nil || len(reports) != 2 {
		t.Fatalf("kept file %s: %v %d reports", b, err, len(reports))
	}
	// One Tally will refuse (no such grant) among the two it takes.
	reports = append(reports[:1], map[string]any{"grant": "bogus", "holder": "gw1", "generation": 1, "customer": "acme", "meter": "tokens", "spent": 1}, reports[1])
	if b, err = json.Marshal(reports); err == nil {
		err = os.WriteFile(kept[0], b, 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
	ts.down.Store(false)
	c := newClient(t, ts, "gw1", dir, admit.Config{MinGrant: 20})
	defer c.Close(ctx)
	eventually(t, "the two reports delivered, the bogus one set aside, the kept file gone", func() bool {
		for _, cu := range customers {
			if b := ts.budget(cu, "tokens"); !b.Consumed.Equal(decimal.NewFromInt(1)) || !b.Live.IsZero() {
				return false
			}
		}
		_, err := os.Stat(filepath.Join(dir, "spend-bogus.rejected"))
		left, _ := filepath.Glob(filepath.Join(dir, "spend-*.json"))
		return err == nil && len(left) == 0
	})
}

// keptWhileDown admits one unit of each customer's tokens (an exact rule
// of 1,000 each) through gw1 under cfg, then closes gw1 while Tally is
// down, and returns gw1's directory, holding the final spend reports.
func keptWhileDown(t *testing.T, ts *tally, cfg admit.Config, customers []string) string {
	t.Helper()
	for _, c := range customers {
		ts.exactRule(c, "tokens", "1000")
	}
	ctx := context.Background()
	dir := t.TempDir()
	c := newClient(t, ts, "gw1", dir, cfg)
	for _, cu := range customers {
		if d, err := c.Admit(ctx, cu, "tokens", 1); err != nil || !d.Admitted {
			t.Fatalf("admit %s: %+v %v", cu, d, err)
		}
	}
	ts.down.Store(true)
	if err := c.Close(ctx); err == nil {
		t.Fatal("close while Tally is down: no undelivered reports")
	}
	return dir
}

// A grant spent in full goes back without its final report written to
// disk first: Tally records it the same whether the report arrives or a
// crash leaves the grant to be reclaimed as fully spent, so there is
// nothing to keep. A grant with capacity left is on disk while its report
// is on the way (a crash would otherwise count its unspent part as
// spent), also when both go in one call. And a report of a spent grant
// that Tally does not take is kept then, and delivered once Tally takes
// it.
func TestOnlyReportsACrashCouldLoseAreWrittenBeforeTheyAreSent(t *testing.T) {
	ts := startTally(t)
	ts.exactRule("acme", "tokens", "1000")
	ctx := context.Background()
	dir := t.TempDir()
	// Every grant is 2 units: a report of 2 is a spent grant's, of 1 a
	// grant given back with capacity left.
	c := newClient(t, ts, "gw1", dir, admit.Config{MinGrant: 2, Lookahead: time.Nanosecond})
	kept := func() []string { // the spent of every report on disk
		var spent []string
		files, _ := filepath.Glob(filepath.Join(dir, "spend-*.json"))
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				continue // delivered meanwhile
			}
			var rs []struct{ Spent int64 }
			if err := json.Unmarshal(keptJSON(b), &rs); err != nil {
				t.Errorf("kept reports %s: %v", f, err)
			}
			for _, r := range rs {
				spent = append(spent, strconv.FormatInt(r.Spent, 10))
			}
		}
		slices.Sort(spent)
		return spent
	}
	type sent struct {
		spent, kept []string // in the call; on disk while it was sent
	}
	var mu sync.Mutex
	var releases []sent
	refuseReleases := atomic.Bool{}
	hook := func(r *http.Request) int {
		if !strings.HasSuffix(r.URL.Path, "/release") {
			return 0
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var one struct{ Spent string }
		var many struct{ Releases []struct{ Spent string } }
		s := sent{kept: kept()}
		if json.Unmarshal(body, &many) == nil && len(many.Releases) > 0 {
			for _, it := range many.Releases {
				s.spent = append(s.spent, it.Spent)
			}
		} else if json.Unmarshal(body, &one) == nil {
			s.spent = append(s.spent, one.Spent)
		}
		slices.Sort(s.spent)
		mu.Lock()
		releases = append(releases, s)
		mu.Unlock()
		if refuseReleases.Load() {
			return http.StatusServiceUnavailable
		}
		return 0
	}
	ts.refuse.Store(&hook)
	sentSoFar := func() []sent {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(releases)
	}
	admitOne := func() {
		t.Helper()
		if d, err := c.Admit(ctx, "acme", "tokens", 1); err != nil || !d.Admitted || d.How != admit.FromGrant {
			t.Fatalf("admit: %+v %v", d, err)
		}
	}

	// A grant of 2, spent: it goes back within a couple of seconds.
	admitOne()
	admitOne()
	eventually(t, "the spent grant given back", func() bool { return len(sentSoFar()) > 0 })
	if r := sentSoFar()[0]; !slices.Equal(r.spent, []string{"2"}) || len(r.kept) > 0 {
		t.Fatalf("first release: spent %q, on disk while it was sent %q; want [2] and nothing", r.spent, r.kept)
	}
	if k := kept(); len(k) > 0 {
		t.Fatalf("final reports %q left on disk after Tally took them", k)
	}

	// Tally refuses releases for load: the next spent grant's report is
	// kept on disk, and delivered when Tally takes releases again.
	refuseReleases.Store(true)
	admitOne()
	admitOne()
	eventually(t, "the refused report kept on disk", func() bool { return slices.Equal(kept(), []string{"2"}) })
	refuseReleases.Store(false)
	eventually(t, "the kept report delivered", func() bool {
		b := ts.budget("acme", "tokens")
		return len(kept()) == 0 && b.Consumed.Equal(decimal.NewFromInt(4)) && b.Live.IsZero()
	})

	// A spent grant and one with capacity left, given back at Close
	// (together, unless the loop gave the spent one back first): only the
	// second is on disk while it is sent.
	n := len(sentSoFar())
	admitOne()
	admitOne()
	admitOne()
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, r := range sentSoFar()[n:] {
		var partial []string
		for _, sp := range r.spent {
			if sp != "2" {
				partial = append(partial, sp)
			}
		}
		if !slices.Equal(r.kept, partial) {
			t.Errorf("a release of %q had %q on disk while it was sent; want only the grants with capacity left, %q", r.spent, r.kept, partial)
		}
		all = append(all, r.spent...)
	}
	slices.Sort(all)
	if !slices.Equal(all, []string{"1", "2"}) {
		t.Fatalf("releases after the last admissions sent %q; want a spent grant's 2 and the last grant's 1", all)
	}
	if b := ts.budget("acme", "tokens"); !b.Consumed.Equal(decimal.NewFromInt(7)) || len(kept()) > 0 {
		t.Fatalf("consumed %s, reports left on disk %q; want the 7 admitted, and nothing kept", b.Consumed, kept())
	}
}

// A release refused for the gateway's credentials (its token revoked or
// rotated away) is not a report Tally can never take: it is kept in Dir,
// nothing is set aside, and the next run with a valid token delivers it,
// so the grants' unspent capacity is freed and Tally's consumed is exactly
// what was admitted.
func TestReportsRefusedForTheTokenAreKept(t *testing.T) {
	ts := startTally(t)
	customers := []string{"acme", "globex"}
	for _, cu := range customers {
		ts.exactRule(cu, "tokens", "1000")
	}
	ctx := context.Background()
	dir := t.TempDir()
	tok, secret, err := tokens.CreateGateway(ctx, ts.pool, "gw1", "to be revoked", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	c, err := admit.New(admit.Config{URL: ts.url, Token: secret, Holder: "gw1", Dir: dir, MinGrant: 20,
		Tick: time.Hour, MaxWait: 10 * time.Second}) // nothing given back before Close
	if err != nil {
		t.Fatal(err)
	}
	for _, cu := range customers {
		if d, err := c.Admit(ctx, cu, "tokens", 1); err != nil || !d.Admitted || d.How != admit.FromGrant {
			t.Fatalf("admit %s: %+v %v", cu, d, err)
		}
	}
	if _, err := tokens.Revoke(ctx, ts.pool, tok.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the revoked token refused", func() bool {
		req, _ := http.NewRequest(http.MethodGet, ts.url+"/v1/customers/acme", nil)
		req.Header.Set("Authorization", "Bearer "+secret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusUnauthorized
	})
	var und *admit.UndeliveredError
	if err := c.Close(ctx); !errors.As(err, &und) || und.Spent != 2 {
		t.Fatalf("close with a revoked token: %v, want the final spend reports (2 units) kept undelivered", err)
	}
	if rejected, _ := filepath.Glob(filepath.Join(dir, "*.rejected")); len(rejected) > 0 {
		t.Fatalf("set aside for an operator: %q, want them kept for the next run", rejected)
	}
	c = newClient(t, ts, "gw1", dir, admit.Config{MinGrant: 20}) // a new token
	defer c.Close(ctx)
	eventually(t, "the kept reports delivered with the new token", func() bool {
		for _, cu := range customers {
			if b := ts.budget(cu, "tokens"); !b.Consumed.Equal(decimal.NewFromInt(1)) || !b.Live.IsZero() {
				return false
			}
		}
		return true
	})
}

// A bit flip in a kept file of final spend reports that leaves it valid
// JSON ("spent":1 read as "spent":0) was delivered as is: Tally freed the
// unit the gateway had admitted, and its budget could admit it again. The
// file is sealed with a CRC-32C now; one that fails it is set aside for an
// operator and its grants are left to be reclaimed as fully spent, which
// frees nothing that was admitted.
func TestADamagedKeptReportIsNotDelivered(t *testing.T) {
	ts := startTally(t)
	customers := []string{"acme", "globex"}
	ctx := context.Background()
	dir := keptWhileDown(t, ts, admit.Config{MinGrant: 20, Tick: time.Hour}, customers)
	kept, _ := filepath.Glob(filepath.Join(dir, "spend-*.json"))
	if len(kept) != 1 {
		t.Fatalf("kept in %d files, want one", len(kept))
	}
	b, err := os.ReadFile(kept[0])
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, []byte(`"spent":1`))
	if i < 0 {
		t.Fatalf("no report of one unit spent in %q", b)
	}
	b[i+len(`"spent":`)] ^= 0x01 // '1' → '0'
	if err := os.WriteFile(kept[0], b, 0o600); err != nil {
		t.Fatal(err)
	}
	ts.down.Store(false)
	c := newClient(t, ts, "gw1", dir, admit.Config{MinGrant: 20})
	defer c.Close(ctx)
	rejected := strings.TrimSuffix(kept[0], ".json") + ".rejected"
	released := func() bool {
		for _, cu := range customers {
			if ts.budget(cu, "tokens").Live.IsZero() {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(rejected); err == nil || released() {
			break
		}
	}
	for _, cu := range customers {
		if bu := ts.budget(cu, "tokens"); bu.Consumed.Add(bu.Live).LessThan(decimal.NewFromInt(1)) {
			t.Errorf("%s: consumed %s and live %s after the damaged report, want the unit admitted still counted", cu, bu.Consumed, bu.Live)
		}
	}
	if _, err := os.Stat(rejected); err != nil {
		t.Errorf("the damaged file is not set aside as %s: %v", filepath.Base(rejected), err)
	}
}

// keptJSON is the JSON of a kept file of final spend reports: after its
// format byte and CRC-32C when sealed.
func keptJSON(b []byte) []byte {
	if len(b) >= 5 && b[0] == 0x01 {
		return b[5:]
	}
	return b
}
