package console_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/ingest/wire"
	"github.com/tally-ledger/tally/reconcile"
)

// demo fills the fixture with what the pages show: two customers with
// usage (acme in Berlin time, with a quota), a dead letter, and a
// reconciliation run with findings.
func (f *fixture) demo() (dead uuid.UUID) {
	f.t.Helper()
	f.calendar("acme", "Europe/Berlin")
	f.quota("acme", "api_calls", "5000000")
	f.usage("acme", "api_calls", time.Date(2026, 11, 2, 9, 0, 0, 0, time.UTC), "1234567")
	f.usage("acme", "api_calls", time.Date(2026, 11, 2, 23, 30, 0, 0, time.UTC), "1000.5") // 3 Nov in Berlin
	f.usage("acme", "api_calls", time.Date(2026, 11, 19, 8, 0, 0, 0, time.UTC), "2500000")
	f.usage("acme", "storage_gb_hours", time.Date(2026, 11, 10, 8, 0, 0, 0, time.UTC), "42.125")
	f.usage("globex", "api_calls", time.Date(2026, 11, 5, 8, 0, 0, 0, time.UTC), "157")
	dead = f.deadLetter("bad_decimal", "records[0].total", "1.5 is a JSON number with a fraction or exponent; send exact decimals",
		"acme", []byte(`{"schema":"tally.meter-batch/v1","records":[{"total":1.5}]}`))
	// Ingest: partition 0 consuming (acme's), partition 1 retrying.
	if _, err := f.pool.Exec(f.ctx(), `INSERT INTO ingest_partitions (topic, partition, next_offset, high_watermark, applied_through, retrying_since, last_error)
		VALUES ('tally.meter-batches', 0, 118, 120, $1, NULL, NULL), ('tally.meter-batches', 1, 40, 95, $2, now(), 'connection refused')`, // the stall clock is Postgres's
		f.now.Add(-1500*time.Millisecond), f.now.Add(-time.Minute)); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.pool.Exec(f.ctx(), `INSERT INTO ingest_customers (customer, topic, partition, first_seen)
		VALUES ('acme', 'tally.meter-batches', 0, $1)`, f.now.Add(-time.Hour)); err != nil {
		f.t.Fatal(err)
	}
	rc, err := reconcile.New(reconcile.Config{Pool: f.pool, Clock: func() time.Time { return f.now }})
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := rc.Run(f.ctx(), reconcile.Options{Period: "current"}); err != nil {
		f.t.Fatalf("reconcile: %v", err)
	}
	return dead
}

func TestAdminSignsInAndSeesEveryPage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dead := f.demo()
	ctx := tab(t)

	if at := f.signIn(t, ctx, adminToken); !strings.HasSuffix(at, "/console/") {
		t.Fatalf("the admin landed on %s, want the overview", at)
	}
	if h := text(t, ctx, "h1"); h != "Overview" {
		t.Fatalf("overview h1 %q", h)
	}
	parts := eval[[][]string](t, ctx, `[...document.querySelectorAll('#ingest ~ .scroll tbody tr')].map(r => [r.className, r.cells[1].textContent.trim(), r.cells[2].textContent])`)
	if len(parts) != 2 || parts[0][0] != "" || !strings.HasPrefix(parts[1][1], "retrying") || parts[1][0] != "bad" || parts[1][2] != "55" {
		t.Fatalf("ingest partitions shown: %q, want partition 1 retrying, marked bad, lag 55", parts)
	}
	if red := eval[string](t, ctx, `getComputedStyle(document.querySelector('#ingest ~ .scroll tr.bad .state')).color`); red != "rgb(180, 35, 24)" {
		t.Fatalf("a retrying partition's state is %s, not red", red)
	}
	if n := text(t, ctx, "#dead + p.big"); n != "1" {
		t.Fatalf("pending dead letters on the overview: %q, want 1", n)
	}
	if s := text(t, ctx, "#recs ~ .scroll td:nth-child(3)"); s != "discrepancies" {
		t.Fatalf("last reconciliation's status %q, want discrepancies (the dead letter)", s)
	}
	accessible(t, ctx)
	screenshot(t, ctx, "overview")

	// From the overview to a customer, by its link.
	do(t, ctx, chromedp.Click(chromedp.CSS(`.chips a[href="/console/customers/acme"]`)), chromedp.WaitVisible(chromedp.CSS("figure.chart")))
	if h := text(t, ctx, "h1"); h != "acme" {
		t.Fatalf("customer h1 %q", h)
	}
	// The admin sees the operator's policy and notes.
	if p := text(t, ctx, "#quotas ~ .scroll tbody tr td:nth-child(7)"); !strings.Contains(p, "enforce") || !strings.Contains(p, "not for customers") {
		t.Fatalf("the admin's policy column: %q", p)
	}
	if h := eval[string](t, ctx, `document.querySelector('details.history tbody').textContent`); !strings.Contains(h, "test: operator note") {
		t.Fatalf("the admin's rule history: %q", h)
	}
	accessible(t, ctx)
	screenshot(t, ctx, "customer")

	if s := f.open(t, ctx, "/console/reconciliations"); s != 200 {
		t.Fatalf("reconciliations: %d", s)
	}
	screenshot(t, ctx, "reconciliations")
	do(t, ctx, chromedp.Click(chromedp.CSS("main table tbody a")), chromedp.WaitVisible(chromedp.CSS("#kinds")))
	groups := eval[[][]string](t, ctx, `[...document.querySelectorAll('#kinds ~ .scroll tbody tr')].map(r => [...r.cells].map(c => c.textContent))`)
	found := false
	for _, g := range groups {
		if g[0] == "discrepancy" && g[1] == "dead_letter" && g[2] == "1" {
			found = true
		}
	}
	if !found {
		t.Fatalf("findings by kind and severity: %v, want a discrepancy dead_letter", groups)
	}
	if href := eval[string](t, ctx, `document.querySelector('#findings ~ .scroll tbody a').getAttribute('href')`); href != "/console/customers/acme" {
		t.Fatalf("a finding links to %q, want its customer", href)
	}
	accessible(t, ctx)
	screenshot(t, ctx, "reconciliation")

	if s := f.open(t, ctx, "/console/dead-letters"); s != 200 {
		t.Fatalf("dead letters: %d", s)
	}
	accessible(t, ctx)
	screenshot(t, ctx, "dead-letters")
	if s := f.open(t, ctx, "/console/dead-letters/"+dead.String()); s != 200 {
		t.Fatalf("dead letter: %d", s)
	}
	if r, fl := text(t, ctx, ".reason"), text(t, ctx, ".field"); r != "bad_decimal" || fl != "records[0].total" {
		t.Fatalf("dead letter reason %q field %q", r, fl)
	}
	accessible(t, ctx)
	screenshot(t, ctx, "dead-letter")

	// Signing out ends the session: the console asks to sign in again.
	if _, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(".signout button"))); err != nil {
		t.Fatal(err)
	}
	f.open(t, ctx, "/console/")
	if loc := run(t, ctx, chromedp.Location()); !strings.Contains(loc, "/console/sign-in") {
		t.Fatalf("after sign-out /console/ is %s", loc)
	}
}

func TestCustomerTokenSeesOnlyItsCustomer(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.demo()
	ctx := tab(t)

	if at := f.signIn(t, ctx, f.customerToken("acme")); !strings.HasSuffix(at, "/console/customers/acme") {
		t.Fatalf("acme's token landed on %s, want its page", at)
	}
	if h := text(t, ctx, "h1"); h != "acme" {
		t.Fatalf("h1 %q", h)
	}
	// Not the operator's policy and notes.
	if cols := eval[int](t, ctx, `document.querySelectorAll('#quotas ~ .scroll thead th').length`); cols != 7 {
		t.Fatalf("a customer's quota table has %d columns, want 7 (no policy)", cols)
	}
	// Not even folded away in the rule's history (textContent: hidden text too).
	if all := eval[string](t, ctx, `document.body.textContent`); strings.Contains(all, "not for customers") ||
		strings.Contains(all, "enforce") || !strings.Contains(all, "Every version of the api_calls rule") {
		t.Fatalf("a customer's page shows the operator's policy or notes, or no rule history:\n%s", all)
	}
	screenshot(t, ctx, "customer-as-customer")

	// On a phone: nothing wider than the screen (wide tables scroll in
	// their own box), the chart scaled to fit.
	do(t, ctx, chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile), chromedp.Reload())
	if over := eval[int](t, ctx, `document.documentElement.scrollWidth - window.innerWidth`); over > 0 {
		t.Fatalf("on a 390 px wide screen the page is %d px too wide", over)
	}
	if w := eval[float64](t, ctx, `document.querySelector('figure.chart svg').getBoundingClientRect().width`); w > 390 || w < 300 {
		t.Fatalf("the chart is %.0f px wide on a 390 px screen", w)
	}
	screenshot(t, ctx, "customer-phone")
	do(t, ctx, chromedp.ResetViewport())

	// Another customer is the same 404 as one that does not exist.
	other := f.open(t, ctx, "/console/customers/globex")
	otherText := text(t, ctx, "main")
	missing := f.open(t, ctx, "/console/customers/nobody")
	missingText := text(t, ctx, "main")
	if other != 404 || missing != 404 || strings.Replace(otherText, "globex", "nobody", 1) != missingText {
		t.Fatalf("globex: %d %q; unknown: %d %q", other, otherText, missing, missingText)
	}
	if s := f.open(t, ctx, "/console/customers/globex/periods/2026-11-01"); s != 404 {
		t.Fatalf("another customer's statement: %d, want 404", s)
	}
	for _, p := range []string{"/console/reconciliations", "/console/dead-letters"} {
		if s := f.open(t, ctx, p); s != 403 {
			t.Fatalf("%s as a customer: %d, want 403", p, s)
		}
	}
	// The overview sends a customer to its own page.
	f.open(t, ctx, "/console/")
	if loc := run(t, ctx, chromedp.Location()); !strings.HasSuffix(loc, "/console/customers/acme") {
		t.Fatalf("a customer's overview is %s", loc)
	}
}

func TestChartNumbersEqualTheRESTUsageAnswer(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.demo()
	ctx := tab(t)
	f.signIn(t, ctx, adminToken)
	f.open(t, ctx, "/console/customers/acme")

	var rest struct {
		Period struct {
			Name string `json:"name"`
		} `json:"period"`
		Items []struct {
			Meter  string `json:"meter"`
			Total  string `json:"total"`
			Series []struct {
				Start    string `json:"start"`
				Quantity string `json:"quantity"`
			} `json:"series"`
		} `json:"items"`
	}
	f.rest("/v1/customers/acme/usage?period=current", adminToken, &rest)
	if len(rest.Items) != 2 {
		t.Fatalf("REST usage: %+v", rest)
	}
	type row struct{ Start, Qty string }
	for _, it := range rest.Items {
		sel := `figure.chart[data-meter="` + it.Meter + `"]`
		shown := eval[[]row](t, ctx, `[...document.querySelectorAll('`+sel+` tr[data-used]')].map(r => ({Start: r.dataset.start, Qty: r.querySelector('.qty').textContent}))`)
		if len(shown) != len(it.Series) {
			t.Fatalf("%s: the chart shows %d days with usage, REST %d: %v vs %+v", it.Meter, len(shown), len(it.Series), shown, it.Series)
		}
		for i, s := range it.Series {
			if shown[i].Start != s.Start || plain(shown[i].Qty) != s.Quantity {
				t.Fatalf("%s day %d: chart %+v, REST %+v", it.Meter, i, shown[i], s)
			}
		}
		total := eval[string](t, ctx, `document.querySelector('`+sel+` .total').textContent`)
		if plain(total) != it.Total {
			t.Fatalf("%s: chart total %q, REST %q", it.Meter, total, it.Total)
		}
		// The bars are there too, one per day so far, each titled with its numbers.
		if n := eval[int](t, ctx, `document.querySelectorAll('`+sel+` svg rect.bar').length`); n != 20 {
			t.Fatalf("%s: %d bars, want 20 (1 to 20 November)", it.Meter, n)
		}
	}
	// The numbers as shown: exact, with thousands separators.
	if q := eval[string](t, ctx, `document.querySelector('figure.chart[data-meter="api_calls"] tr[data-used] .qty').textContent`); q != "1,234,567" {
		t.Fatalf("first day shown as %q, want 1,234,567", q)
	}
	if tot := eval[string](t, ctx, `document.querySelector('figure.chart[data-meter="api_calls"] .total').textContent`); tot != "3,735,567.5" {
		t.Fatalf("total shown as %q, want 3,735,567.5", tot)
	}
	// The quota line is drawn, labelled with the limit.
	if l := eval[string](t, ctx, `document.querySelector('figure.chart[data-meter="api_calls"] .limitlabel').textContent`); l != "limit 5,000,000" {
		t.Fatalf("quota line label %q", l)
	}
}

// TestChartDaysWhereClocksSkipMidnight: in America/Havana the day DST
// starts (2026-03-08) begins at 01:00, when the clocks jump past midnight;
// the chart has that day once, with its usage, as the REST answer does.
func TestChartDaysWhereClocksSkipMidnight(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.calendar("hav", "America/Havana")
	f.usage("hav", "api_calls", time.Date(2026, 3, 8, 4, 30, 0, 0, time.UTC), "3") // 23:30 CST on the 7th
	f.usage("hav", "api_calls", time.Date(2026, 3, 8, 12, 0, 0, 0, time.UTC), "5") // 08:00 CDT on the 8th
	c := f.client()
	f.signInHTTP(c, adminToken)
	res := f.get(c, "/console/customers/hav?period=2026-03-01")
	if res.status != 200 {
		t.Fatalf("customer page: %d %s", res.status, res.body)
	}
	for _, want := range []string{
		`<tr data-start="2026-03-07T05:00:00Z" data-used="1"><td>Sat 7 Mar</td><td class="n qty">3</td>`,
		`<tr data-start="2026-03-08T05:00:00Z" data-used="1"><td>Sun 8 Mar</td><td class="n qty">5</td>`,
		`<tr data-start="2026-03-09T04:00:00Z"><td>Mon 9 Mar</td>`,
	} {
		if !strings.Contains(res.body, want) {
			t.Fatalf("the page lacks %s:\n%s", want, res.body)
		}
	}
	if n := strings.Count(res.body, "<td>Sat 7 Mar</td>"); n != 1 {
		t.Fatalf("7 March shown %d times", n)
	}
}

// plain removes thousands separators.
func plain(s string) string { return strings.ReplaceAll(strings.TrimSpace(s), ",", "") }

func TestDeadLetterBytesRenderAsText(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const evil = `<script>alert(1)</script>`
	id := f.deadLetter("bad_json", "", `invalid character '<' looking for beginning of value: <img src=x onerror=alert(2)>`,
		`<b>acme</b>`, []byte(evil))
	var dialogs atomic.Int32
	ctx := tab(t)
	if err := chromedp.Listen(ctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			dialogs.Add(1)
		}
	}); err != nil {
		t.Fatal(err)
	}
	f.signIn(t, ctx, adminToken)
	for _, path := range []string{"/console/dead-letters", "/console/dead-letters/" + id.String()} {
		if s := f.open(t, ctx, path); s != 200 {
			t.Fatalf("%s: %d", path, s)
		}
		if n := eval[int](t, ctx, `document.querySelectorAll('script, img, b').length`); n != 0 {
			t.Fatalf("%s: %d script, img or b elements: the bytes were taken as markup", path, n)
		}
	}
	if raw := eval[string](t, ctx, `document.querySelector('#raw').textContent`); raw != evil {
		t.Fatalf("raw bytes shown as %q, want %q", raw, evil)
	}
	if key := text(t, ctx, ".key"); key != `<b>acme</b>` {
		t.Fatalf("key shown as %q", key)
	}
	screenshot(t, ctx, "dead-letter-script")
	if n := dialogs.Load(); n != 0 {
		t.Fatalf("%d dialogs opened", n)
	}
}

func TestReplayNeedsTheFormsCSRFToken(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// A message refused before a fix (its producer's clock ran ahead):
	// valid now.
	msg, err := wire.Encode(wire.Batch{Schema: wire.Schema, BatchID: uuid.Must(uuid.NewV7()), Producer: "gw-1", Epoch: 1,
		SentAt: f.now.Add(-time.Hour), Records: []wire.Record{{OperationID: uuid.Must(uuid.NewV7()), Customer: "acme",
			Meter: "api_calls", Seq: 1, Total: decimal.RequireFromString("42"), OccurredAt: f.now.Add(-2 * time.Hour)}}})
	if err != nil {
		t.Fatal(err)
	}
	id := f.deadLetter("clock_skew", "records[0].occurred_at", "occurred_at is in the future", "acme", msg)
	ctx := tab(t)
	f.signIn(t, ctx, adminToken)
	f.open(t, ctx, "/console/dead-letters/"+id.String())

	// A forged token: refused, nothing replayed.
	do(t, ctx, chromedp.SetValue(chromedp.CSS(`form.replay input[name="csrf"]`), "forged"),
		chromedp.Click(chromedp.CSS("#confirm")))
	res, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS("#replay")))
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != 403 || !strings.Contains(text(t, ctx, "h1"), "Form expired") {
		t.Fatalf("replay with a forged CSRF token: %d %q", res.Status, text(t, ctx, "main"))
	}
	if d := f.getDeadLetter(id); d.ReplayedAt != nil {
		t.Fatal("replayed without the CSRF token")
	}

	// The page's own token: replayed.
	f.open(t, ctx, "/console/dead-letters/"+id.String())
	do(t, ctx, chromedp.Click(chromedp.CSS("#confirm")))
	res, err = chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS("#replay")))
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != 200 || !strings.HasPrefix(text(t, ctx, "#replay-result"), "Replayed.") {
		t.Fatalf("replay: %d %q", res.Status, text(t, ctx, "main"))
	}
	if d := f.getDeadLetter(id); d.ReplayedAt == nil {
		t.Fatal("not replayed")
	}
	screenshot(t, ctx, "dead-letter-replayed")
	var usage struct {
		Items []struct {
			Total string `json:"total"`
		} `json:"items"`
	}
	f.rest("/v1/customers/acme/usage", adminToken, &usage)
	if len(usage.Items) != 1 || usage.Items[0].Total != "42" {
		t.Fatalf("usage after replay: %+v", usage)
	}
}

func (f *fixture) getDeadLetter(id uuid.UUID) ingest.DeadLetter {
	f.t.Helper()
	d, err := ingest.GetDeadLetter(context.Background(), f.pool, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return d
}

// accessible checks what a screen-reader or keyboard user needs of every
// page: a language, a title, one h1, a skip link to main, a label for every
// form control, a text alternative for every chart, and a header cell
// scoped in every table.
func accessible(t *testing.T, ctx context.Context) {
	t.Helper()
	problems := eval[[]string](t, ctx, `(() => {
		const p = [];
		if (!document.documentElement.lang) p.push('no lang');
		if (!document.title) p.push('no title');
		if (document.querySelectorAll('h1').length !== 1) p.push(document.querySelectorAll('h1').length + ' h1');
		const skip = document.querySelector('a.skip');
		if (!skip || !document.querySelector(skip.getAttribute('href'))) p.push('no skip link to main');
		for (const i of document.querySelectorAll('input:not([type=hidden]), select, textarea'))
			if (!i.labels || i.labels.length === 0) p.push('unlabelled ' + (i.name || i.id));
		for (const s of document.querySelectorAll('svg'))
			if (s.getAttribute('role') !== 'img' || !s.querySelector('title')) p.push('chart without a text alternative');
		for (const tb of document.querySelectorAll('table'))
			if (!tb.querySelector('th[scope]')) p.push('table without scoped headers');
		return p;
	})()`)
	if len(problems) > 0 {
		t.Fatalf("%s: %v", run(t, ctx, chromedp.Location()), problems)
	}
}
