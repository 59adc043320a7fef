package admit

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/tally-ledger/tally/internal/ids"
	"github.com/tally-ledger/tally/internal/pause"
	"github.com/tally-ledger/tally/quota"
	"github.com/tally-ledger/tally/validation"
)

// How says where a decision came from.
type How uint8

// Sources of a decision.
const (
	// None is the zero How; Admit never answers with it.
	None How = iota
	// FromGrant: from capacity leased from Tally.
	FromGrant
	// Bypass: admitted without a grant (Tally unreachable, policy allow or
	// local); recorded on disk and reported later.
	Bypass
	// FromDecision: a lagged rule, answered from the latest decision read
	// from tally.quota-decisions (or by on_stale, see Decision.Stale).
	FromDecision
	// NoRule: admitted; the customer and meter have no quota rule.
	NoRule
	// Exhausted: refused by the budget: Tally refused a grant (Binding
	// names the budget that did, RetryAfter when capacity may free), or
	// the capacity granted went to concurrent callers.
	Exhausted
	// Unreachable: refused by on_unreachable (deny, or local's amount
	// used up): Tally could not be reached, was slower than MaxWait, or
	// refused for load, or could not decide a grant request whose budgets
	// kept changing. RetryAfter is when the client asks Tally again.
	Unreachable
	// Debited: admitted by a debit: the budget was tight and the gateway
	// held nothing, so Tally took the request's cost from every budget
	// that applies, as a central counter would (a refused debit is
	// Exhausted).
	Debited

	numHow
)

func (h How) String() string {
	switch h {
	case FromGrant:
		return "grant"
	case Bypass:
		return "bypass"
	case FromDecision:
		return "decision"
	case NoRule:
		return "no-rule"
	case Exhausted:
		return "exhausted"
	case Unreachable:
		return "unreachable"
	case Debited:
		return "debit"
	}
	return "none"
}

// ErrClosed: Admit was called on a closed Client for a budget it holds
// no grant of. A closed client asks Tally for nothing.
var ErrClosed = errors.New("admit: the client is closed")

// Decision is the answer of Admit.
type Decision struct {
	Admitted bool
	How      How
	// Binding names the budget that refused ("customer:<id>/<meter>").
	Binding string
	// RetryAfter is Tally's estimate of when capacity may free up (How
	// Exhausted; at a period's end it is the time until the next period,
	// which may be weeks), or, when Tally was unreachable and the request
	// was refused (How Unreachable), when the client asks it again (never
	// 0: at least a tick, growing with the backoff). An admitted decision
	// has nothing to retry: its RetryAfter is 0, a bypass's included.
	RetryAfter time.Duration
	// Unreachable: Tally could not be reached when a grant was needed (or
	// was slower than MaxWait, or refused for load): the rule's
	// on_unreachable answered. How is Bypass when it admitted, Unreachable
	// when it refused.
	Unreachable bool
	// Stale (How FromDecision): the decision was older than its rule's
	// stale_after, or none had been read, so on_stale answered.
	Stale bool
	// Shadow (How FromDecision): the customer is over a shadow-mode rule,
	// which only observes: admitted all the same.
	Shadow bool
}

// Policy is what Admit does when it needs a grant and Tally cannot be
// reached: the rule's on_unreachable, learnt with each grant.
type Policy string

// Policies.
const (
	Deny  Policy = "deny"
	Local Policy = "local"
	Allow Policy = "allow"
)

// Config configures a Client.
type Config struct {
	// URL of Tally's API, e.g. "http://127.0.0.1:8080": http or https,
	// with a host; a trailing slash is dropped. Required.
	URL string
	// Token: a gateway token for Holder (tally tokens create --gateway H).
	// Required.
	Token string
	// Holder is this gateway's stable id: 1 to 128 of A-Z a-z 0-9 . _ : -.
	// Required.
	Holder string
	// Dir keeps the generation, the bypass journal and the final spend
	// reports not yet delivered to Tally. Required; one directory per
	// holder, kept across restarts.
	Dir string
	// OnUnreachable with LocalAmount per LocalEvery for Local: the policy
	// for a budget until a grant has brought its rule's on_unreachable
	// (which then applies). Default Deny.
	OnUnreachable Policy
	LocalAmount   int64
	LocalEvery    time.Duration
	// GrantTTL asked for each grant. Default 30 s.
	GrantTTL time.Duration
	// RateGrantTTL is asked instead for a budget whose grants draw from a
	// rate budget (docs/design.md §17; learnt from a grant's "rate"):
	// Tally's bound grows with it. Default 1 s, at most 10 s.
	RateGrantTTL time.Duration
	// Lookahead: grants are sized to cover this much of measured demand
	// (while the budget is tight, a grant is an Admit's cost alone: a
	// grant came back smaller than asked, or was refused, within the last
	// Lookahead).
	// Default 2 s.
	Lookahead time.Duration
	// MinGrant is the smallest grant asked for while the budget is not
	// tight. Default 10.
	MinGrant int64
	// Tick is the period of the background loop. Default 50 ms.
	Tick time.Duration
	// HTTPClient; default one with a 2 s timeout that keeps up to
	// DefaultIdleConns connections to Tally open between calls. Its
	// timeout bounds the background calls (renew, release, reports, and a
	// grant request Admit stopped waiting for), never an Admit: see
	// MaxWait. A client of your own should keep as many idle connections
	// as budgets may ask for grants at once (http.Transport's
	// MaxIdleConnsPerHost, 2 by default), or most grant requests of a
	// burst pay a new connection's handshake.
	HTTPClient *http.Client
	Logger     *slog.Logger
	// MaxWait bounds how long Admit waits for Tally when it needs a grant
	// (ctx may bound it further). Default 250 ms. When Tally is slower,
	// Admit answers by the rule's on_unreachable at once, the request
	// goes on in the background (a grant it brings is used), and Tally
	// counts as unreachable: until it answers again, Admit does not wait
	// for it at all (background probing with backoff, up to MaxBackoff).
	MaxWait time.Duration
	// CloseTimeout bounds Close (ctx may bound it further). Default 2 s.
	// Final spend reports not delivered by then stay in Dir, and Close
	// returns an *UndeliveredError saying how many.
	CloseTimeout time.Duration
	// Registerer receives the client's Prometheus metrics
	// (tally_admit_*, docs/gateways-exact.md). Nil: no metrics. One
	// client per registry at a time: Close takes its metrics off, so a
	// new client may register on the same registry.
	Registerer prometheus.Registerer

	// Brokers are Kafka bootstrap addresses: lagged rules are answered
	// from the decisions read there. Without Brokers a lagged rule is
	// always answered by OnStale.
	Brokers []string
	// DecisionsTopic. Default "tally.quota-decisions".
	DecisionsTopic string
	// DecisionHistory: how far back the topic is read at start. Default
	// 2 min (the enforcer republishes every key at least every 30 s).
	DecisionHistory time.Duration
	// Dialer connects to Kafka (TLS, SASL). Default kafka.DefaultDialer.
	Dialer *kafka.Dialer
	// OnStale (Allow or Deny, default Allow as a rule's on_stale) answers
	// a lagged rule for which no decision has been read yet. Once one has
	// been read, the rule's own on_stale applies when it is stale.
	OnStale Policy
	// RuleRecheck: how often a budget found lagged or without a rule asks
	// Tally again whether its rule became exact (also whenever a decision
	// with a new rule version arrives). Default 30 s.
	RuleRecheck time.Duration
	// ForgetAfter: a budget (a customer and meter) that no Admit has used
	// for this long is forgotten once it holds nothing (no grant, no
	// report on its way): its memory goes, and a lagged rule's or a
	// meter's without a rule stops being rechecked (RuleRecheck). Its next
	// Admit asks Tally as a first one does; while Tally cannot be
	// reached, the on_unreachable its rule's grants brought answers it
	// (OnUnreachable when none did). Default 5 min.
	ForgetAfter time.Duration
}

// Validate reports every problem of c at once, as *validation.FieldError
// joined (Field is the Config field's name).
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, validation.Errorf(field, format, args...))
	}
	// The scheme is checked before the URL is parsed: Go's parser refuses
	// a host and port alone ("127.0.0.1:8080") with an error that does
	// not say what is missing, and takes "localhost:8080" as the scheme
	// "localhost".
	scheme, rest, hasScheme := strings.Cut(c.URL, "://")
	switch u, err := url.Parse(c.URL); {
	case c.URL == "":
		bad("URL", "is required, e.g. \"http://127.0.0.1:8080\"")
	case !hasScheme || !strings.EqualFold(scheme, "http") && !strings.EqualFold(scheme, "https"):
		if !hasScheme {
			rest = strings.TrimPrefix(c.URL, "//")
		}
		bad("URL", "%q needs a scheme, http:// or https:// (e.g. \"http://%s\")", c.URL, rest)
	case err != nil:
		bad("URL", "%q is not a URL: %v", c.URL, err)
	case u.Host == "":
		bad("URL", "%q has no host", c.URL)
	case u.RawQuery != "" || u.Fragment != "":
		bad("URL", "%q must not have a query or fragment", c.URL)
	}
	if strings.TrimSpace(c.Token) == "" {
		bad("Token", "is required: a gateway token for Holder (tally tokens create --gateway %s)", c.Holder)
	} else if strings.TrimSpace(c.Token) != c.Token || strings.ContainsAny(c.Token, " \t\r\n") {
		bad("Token", "has white space in it (copied with a newline?)")
	}
	if !ids.Valid(c.Holder) {
		bad("Holder", "%q must be "+ids.Rule, c.Holder)
	}
	if c.Dir == "" {
		bad("Dir", "is required: the holder's generation, bypass journal and final spend reports, kept across restarts")
	}
	switch c.OnUnreachable {
	case "", Deny, Allow:
	case Local:
		if c.LocalAmount <= 0 || c.LocalEvery <= 0 {
			bad("OnUnreachable", "local needs a positive LocalAmount and LocalEvery")
		}
	default:
		bad("OnUnreachable", "%q must be deny, local or allow", c.OnUnreachable)
	}
	switch c.OnStale {
	case "", Deny, Allow:
	default:
		bad("OnStale", "%q must be deny or allow", c.OnStale)
	}
	for i, b := range c.Brokers {
		if b == "" {
			bad(fmt.Sprintf("Brokers[%d]", i), "is empty")
		}
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"DecisionHistory", c.DecisionHistory}, {"RuleRecheck", c.RuleRecheck}, {"GrantTTL", c.GrantTTL},
		{"Lookahead", c.Lookahead}, {"Tick", c.Tick}, {"MaxWait", c.MaxWait}, {"CloseTimeout", c.CloseTimeout},
		{"LocalEvery", c.LocalEvery}, {"ForgetAfter", c.ForgetAfter}} {
		if d.v < 0 {
			bad(d.field, "%s must not be negative (0: the default)", d.v)
		}
	}
	if c.RateGrantTTL < 0 || c.RateGrantTTL > 10*time.Second || (c.RateGrantTTL > 0 && c.RateGrantTTL < time.Second) {
		bad("RateGrantTTL", "%s must be from 1s to 10s (0: the default, 1s)", c.RateGrantTTL)
	}
	if c.GrantTTL > 0 && c.GrantTTL < time.Second {
		bad("GrantTTL", "%s is below a second: Tally takes whole grants of at least 1s", c.GrantTTL)
	} else if c.GrantTTL > time.Hour || c.GrantTTL%time.Microsecond != 0 {
		bad("GrantTTL", "%s must be whole microseconds, at most 1h: Tally refuses any other grant ttl", c.GrantTTL)
	}
	if c.MinGrant < 0 || c.LocalAmount < 0 {
		bad("MinGrant", "MinGrant and LocalAmount must not be negative")
	}
	return errors.Join(errs...)
}

// Client admits requests for one holder.
type Client struct {
	cfg        Config
	generation atomic.Int64 // see recoverGeneration
	http       *http.Client
	log        *slog.Logger
	budgets    budgetMap
	mu         sync.Mutex // adding and forgetting budgets, and learnt
	// learnt: the on_unreachable of forgotten budgets whose rule's differs
	// from Config.OnUnreachable (one per such customer and meter).
	learnt    map[key]policy
	journal   *journal
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closed    atomic.Bool // set by Close before it gives the grants back
	bg        context.Context
	stopBG    context.CancelFunc // ends the loop's and background grant requests' calls at Close
	fetchMu   sync.RWMutex       // orders starting a background grant request against Close
	fetches   sync.WaitGroup
	reach     reach
	metrics   *metrics
	reportMu  sync.Mutex
	reportAt  map[string]time.Time // final spend reports not to resend before
	// keptMu serialises rewriting and removing files of kept reports: a
	// file being delivered by the top-up that kept it may be delivered by
	// the loop too (a report delivered twice is settled as delivered), and
	// two rewrites through one temporary file must not interleave.
	keptMu sync.Mutex

	decMu      sync.Mutex // decisions, and handing them to budgets as they are added
	decisions  map[key]*lagged
	stopReader context.CancelFunc
	readers    sync.WaitGroup
	kafka      kafkaReach // whether the decision readers can read Kafka

	// genMu orders grant requests (read-locked across the call and the
	// noting of issued) against recoverGeneration (write-locked): a
	// generation a grant was issued under is never left for a newer one.
	genMu  sync.RWMutex
	issued atomic.Bool // a grant was issued in this run
	// noBatchRelease: this Tally has no POST /v1/grants/release; final
	// reports go one per call.
	noBatchRelease atomic.Bool
	fenced         bool // refused as stale after issued, logged; under genMu
	// spendOnDisk and bypassesOnDisk: Dir may hold final spend reports or
	// sealed bypass reports to deliver (an earlier run's, or this run's
	// not taken yet). Set after such a file is written, cleared by the
	// loop's scan that finds none left: the loop reads Dir only then, not
	// every tick.
	spendOnDisk, bypassesOnDisk atomic.Bool

	// ownTransport is the default HTTPClient's transport (nil when the
	// caller gave a client): Close closes its idle connections.
	ownTransport *http.Transport
}

type key struct{ customer, meter string }

// DefaultIdleConns is how many idle connections to Tally the default
// HTTPClient keeps: each budget has at most one grant request in flight,
// so a burst over many customers needs that many connections at once, and
// the next burst finds them open.
const DefaultIdleConns = 256

func defaultTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = DefaultIdleConns, DefaultIdleConns
	return tr
}

// New reads and bumps the holder's generation on disk, reports bypasses
// left by earlier runs when Tally answers, and starts the background loop.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("admit: invalid Config: %w", err)
	}
	cfg.URL = strings.TrimRight(cfg.URL, "/") // "http://tally:8080/" + "/v1/grants" is not a route
	if cfg.MaxWait == 0 {
		cfg.MaxWait = 250 * time.Millisecond
	}
	if cfg.CloseTimeout == 0 {
		cfg.CloseTimeout = 2 * time.Second
	}
	if cfg.OnUnreachable == "" {
		cfg.OnUnreachable = Deny
	}
	if cfg.GrantTTL == 0 {
		cfg.GrantTTL = 30 * time.Second
	}
	if cfg.RateGrantTTL == 0 {
		cfg.RateGrantTTL = time.Second
	}
	if cfg.Lookahead == 0 {
		cfg.Lookahead = 2 * time.Second
	}
	if cfg.MinGrant == 0 {
		cfg.MinGrant = 10
	}
	if cfg.Tick == 0 {
		cfg.Tick = 50 * time.Millisecond
	}
	var own *http.Transport // the default client's, closed with the client
	if cfg.HTTPClient == nil {
		own = defaultTransport()
		cfg.HTTPClient = &http.Client{Timeout: 2 * time.Second, Transport: own}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.OnStale == "" {
		cfg.OnStale = Allow
	}
	if cfg.DecisionsTopic == "" {
		cfg.DecisionsTopic = quota.DefaultTopic
	}
	if cfg.DecisionHistory == 0 {
		cfg.DecisionHistory = 2 * time.Minute
	}
	if cfg.Dialer == nil {
		cfg.Dialer = kafka.DefaultDialer
	}
	if cfg.RuleRecheck == 0 {
		cfg.RuleRecheck = 30 * time.Second
	}
	if cfg.ForgetAfter == 0 {
		cfg.ForgetAfter = 5 * time.Minute
	}
	c := &Client{cfg: cfg, http: cfg.HTTPClient, ownTransport: own, log: cfg.Logger,
		stop: make(chan struct{}), done: make(chan struct{}),
		decisions: map[key]*lagged{}, reportAt: map[string]time.Time{}}
	// The metrics are registered before anything is written to Dir, so a
	// New refused for its registry leaves the holder's generation as it
	// was; later failures take them off the registry again.
	var err error
	if c.metrics, err = newMetrics(cfg.Registerer, c); err != nil {
		return nil, fmt.Errorf("admit: metrics: %w", err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		c.metrics.unregister()
		return nil, fmt.Errorf("admit: state directory: %w", err)
	}
	gen, err := bumpGeneration(cfg.Dir)
	if err != nil {
		c.metrics.unregister()
		return nil, err
	}
	if c.journal, err = openJournal(cfg.Dir, gen); err != nil {
		c.metrics.unregister()
		return nil, err
	}
	c.generation.Store(gen)
	c.spendOnDisk.Store(true) // an earlier run's, delivered by the first scan
	c.bypassesOnDisk.Store(true)
	c.bg, c.stopBG = context.WithCancel(context.Background())
	rctx, cancel := context.WithCancel(context.Background())
	c.stopReader = cancel
	if len(cfg.Brokers) > 0 {
		c.readers.Add(1)
		go c.readDecisions(rctx, &c.readers)
	}
	go c.loop()
	return c, nil
}

// Generation is this run's generation of the holder: the one New took,
// or the one Tally said to recover with when this holder had lost its Dir
// (see recoverGeneration).
func (c *Client) Generation() int64 { return c.generation.Load() }

// recoverGeneration answers a grant request sent under generation sent and
// refused as stale, next being Tally's next_generation. A holder issued
// nothing in this run lost its state (a new or wiped Dir): it keeps next
// durably in Dir/generation, then uses it, and says whether to ask again.
// A holder that was issued grants in this run is the older of two
// processes sharing the holder id: it keeps its generation (taking next
// would fence the other one, which would then fence it, in turn) and the
// refusal stands.
func (c *Client) recoverGeneration(sent, next int64) bool {
	c.genMu.Lock()
	defer c.genMu.Unlock()
	if cur := c.generation.Load(); cur != sent {
		return cur > sent // another grant request recovered meanwhile
	}
	if c.issued.Load() || next <= sent {
		if c.fenced {
			return false // logged once: every later grant request is refused alike
		}
		c.fenced = true
		c.log.Error("holder generation refused as stale after grants were issued in this run: another process uses this holder id; not taking a newer generation",
			"holder", c.cfg.Holder, "generation", sent, "next_generation", next)
		return false
	}
	if err := writeGeneration(c.cfg.Dir, next); err != nil {
		c.log.Error("holder generation not recovered: next_generation not kept on disk", "holder", c.cfg.Holder,
			"generation", sent, "next_generation", next, "err", err)
		return false
	}
	if err := c.journal.setGeneration(next); err != nil {
		c.log.Error("bypass journal", "err", err)
	}
	c.generation.Store(next)
	c.log.Info("holder generation older than Tally's: nothing issued in this run, taking next_generation",
		"holder", c.cfg.Holder, "generation", sent, "next_generation", next)
	return true
}

// bumpGeneration reads the generation file, writes the next one durably,
// and returns it.
//
// The file is sealed: the generation, a tab, and the CRC-32C of the
// generation's digits (8 hex digits). A bit flip that left a number (a '5'
// turned '4') would otherwise start a run at a generation an earlier run
// used, which Tally accepts as current when it was its newest, or below
// generations Tally never saw (an earlier run that only bypassed): two
// runs share a generation, or it goes back, and nothing says so. A file
// that fails its CRC, or is not a number, refuses New: the holder's
// generation is not known, and taking any would be a guess. A file
// holding the number alone was written by an earlier version of this
// package and is read as it is.
func bumpGeneration(dir string) (int64, error) {
	path := filepath.Join(dir, "generation")
	var gen int64
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		var ok bool
		if gen, ok = readGeneration(b); !ok {
			return 0, fmt.Errorf("admit: %s is damaged (not a generation, or it fails its CRC-32C: %q): the holder's generation is not known; "+
				"move it aside, and the next New recovers as after a lost Dir (docs/gateways-exact.md)", path, b)
		}
	case errors.Is(err, os.ErrNotExist):
	default:
		return 0, fmt.Errorf("admit: read generation: %w", err)
	}
	gen++
	if err := writeGeneration(dir, gen); err != nil {
		return 0, err
	}
	return gen, nil
}

// readGeneration reads a generation file: sealed, or the number alone.
func readGeneration(b []byte) (int64, bool) {
	text := strings.TrimSuffix(string(b), "\n")
	num, sum, sealed := strings.Cut(text, "\t")
	if !sealed {
		num = strings.TrimSpace(text)
	} else if sum != generationSum(num) {
		return 0, false
	}
	gen, err := strconv.ParseInt(num, 10, 64)
	return gen, err == nil && gen >= 0
}

// generationSum is the CRC-32C of a generation's digits.
func generationSum(num string) string {
	return fmt.Sprintf("%08x", crc32.Checksum([]byte(num), castagnoli))
}

// writeGeneration keeps gen durably in dir/generation, sealed.
func writeGeneration(dir string, gen int64) error {
	num := strconv.FormatInt(gen, 10)
	if err := writeFileSync(filepath.Join(dir, "generation"), []byte(num+"\t"+generationSum(num)+"\n")); err != nil {
		return fmt.Errorf("admit: write generation: %w", err)
	}
	return nil
}

func writeFileSync(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Admit decides whether a request of cost units of meter for customer may
// pass. Under an exact rule, from a held grant it answers from memory
// without locking or allocating; with no capacity left it asks Tally for a
// grant, waiting at most MaxWait (and ctx). When Tally is unreachable,
// slower than that, or refusing for load, the rule's on_unreachable
// answers at once; while Tally stays so, Admit does not wait for it at
// all. Under a lagged rule it answers from the latest decision in memory,
// without locking or allocating either, unless that decision carries a
// rule version Tally was not asked about yet: then it asks first, as the
// first call for a customer and meter asks Tally which kind of rule they
// have.
//
// Admit's errors: cost not positive; a bypass that could not be written
// to the journal (so it was not admitted); ErrClosed; and a *TallyError
// when Tally refuses this client itself (401 token unknown or revoked,
// 403 token not for Holder, 400): setup mistakes that Check reports at
// start. Tally being down, slow or overloaded is never an error: it is
// the Decision's Unreachable.
func (c *Client) Admit(ctx context.Context, customer, meter string, cost int64) (Decision, error) {
	if cost <= 0 {
		return Decision{}, fmt.Errorf("admit: cost %d must be positive", cost)
	}
	b := c.budgets.load(key{customer, meter})
	if b != nil {
		if b.kind.Load() >= kindLagged && !b.unchecked() {
			return b.counted(c.fromDecision(b)), nil
		}
		if b.take(cost) {
			return Decision{Admitted: true, How: FromGrant}, nil
		}
	}
	d, err := c.admitSlow(ctx, customer, meter, cost, b)
	if err == nil && d.How != FromGrant {
		c.metrics.admit(d)
	}
	return d, err
}

func (c *Client) admitSlow(ctx context.Context, customer, meter string, cost int64, b *budget) (Decision, error) {
	if b == nil {
		// Only here can a budget be added: one exists only for ids.
		if err := checkIDs(customer, meter); err != nil {
			return Decision{}, err
		}
	}
	held := c.hold(customer, meter, b)
	defer held.users.Add(-1)
	if held != b {
		b = held // new, or b was forgotten: another Admit may have filled it
		if b.take(cost) {
			return Decision{Admitted: true, How: FromGrant}, nil
		}
	}
	b.misses.Add(1)
	b.slowUses.Add(1)
	now := time.Now()
	// Refused recently: answer from memory until retry_after, when this
	// Admit misses at least what was refused.
	if until := b.refusedUntil.Load(); until > 0 && now.UnixNano() < until && cost-b.available() >= b.refusedNeed.Load() {
		binding := b.binding
		if by := b.refusedBy.Load(); by != nil {
			binding = *by // a pool's or the global budget may have refused
		}
		return Decision{How: Exhausted, Binding: binding, RetryAfter: time.Duration(until - now.UnixNano())}, nil
	}
	if c.closed.Load() {
		return Decision{}, ErrClosed
	}
	// Tally known unreachable, or asked for a pause: answer at once. A
	// grant request goes on in the background when the pause is over: the
	// probe whose answer lets the next call be served from a grant.
	if c.reach.down.Load() || c.paused(now) {
		if !c.paused(now) {
			c.fetch(b, cost)
		}
		return c.unanswered(customer, meter, cost, b)
	}
	if b.kind.Load() == kindExact && b.tight(now) && !b.rateBudget.Load() {
		// Near the budget's end a grant would be the size of this request
		// and be given back at the next tick: take the cost centrally
		// instead, in one call, with nothing held and nothing to release.
		// Not on a rate budget: a debit of a bucket is an issue transaction
		// of its own, and twenty gateways debiting one bucket queued on it
		// (docs/performance.md, "Debits").
		return c.admitByDebit(ctx, customer, meter, cost, b)
	}
	b.waiting.Add(cost)
	defer b.waiting.Add(-cost) // after the take below
	t := time.NewTimer(c.cfg.MaxWait)
	defer t.Stop()
	for answered := false; ; answered = true {
		f := c.fetch(b, cost)
		select {
		case <-f.done:
		case <-t.C:
			if answered {
				// Tally grants, but others kept taking it first.
				return Decision{How: Exhausted, Binding: b.binding, RetryAfter: c.cfg.Tick}, nil
			}
			// Slower than the bound: Tally counts as unreachable until it
			// answers (the request goes on and its grant will be used).
			c.markDown(fmt.Errorf("no answer to a grant request within MaxWait (%s)", c.cfg.MaxWait))
			return c.unanswered(customer, meter, cost, b)
		case <-ctx.Done():
			// The caller's own bound: answered as Tally not answering in
			// time, without calling Tally unreachable.
			return c.unanswered(customer, meter, cost, b)
		}
		err := f.err
		if b.kind.Load() >= kindLagged {
			return c.fromDecision(b), nil
		}
		if b.take(cost) {
			return Decision{Admitted: true, How: FromGrant}, nil
		}
		var ex *exhaustedError
		switch {
		case errors.As(err, &ex):
			return Decision{How: Exhausted, Binding: ex.Binding, RetryAfter: ex.RetryAfter}, nil
		case err != nil && (isUnreachable(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
			return c.unanswered(customer, meter, cost, b)
		case err != nil:
			return Decision{}, err
		}
		// Granted, but concurrent callers took the capacity first (the
		// request joined was sized before they all arrived): Tally has not
		// refused, so ask again, within MaxWait.
	}
}

// fetch starts a grant request for b covering at least need, or joins the
// one in flight. It runs in the background: an Admit that stops waiting
// for it leaves it to finish, and what it brings is used.
func (c *Client) fetch(b *budget, need int64) *fetch {
	b.fmu.Lock()
	defer b.fmu.Unlock()
	if f := b.inflight; f != nil {
		return f
	}
	f := &fetch{done: make(chan struct{})}
	c.fetchMu.RLock()
	defer c.fetchMu.RUnlock()
	if c.closed.Load() {
		f.err = ErrClosed
		close(f.done)
		return f
	}
	b.inflight = f
	c.fetches.Add(1)
	go func() {
		defer c.fetches.Done()
		f.err = c.topUp(c.bg, b, need)
		b.fmu.Lock()
		b.inflight = nil
		b.fmu.Unlock()
		close(f.done)
	}()
	return f
}

// fetch is a grant request in flight; err is set before done is closed.
type fetch struct {
	done chan struct{}
	err  error
}

// unanswered answers a request Tally did not answer about in time. A
// lagged rule (or none) asking about a newer rule version keeps answering
// from its decision, as it does while Tally is down: on_unreachable is an
// exact rule's policy.
func (c *Client) unanswered(customer, meter string, cost int64, b *budget) (Decision, error) {
	if b.kind.Load() >= kindLagged {
		return c.fromDecision(b), nil
	}
	return c.unreachable(customer, meter, cost, b)
}

// unreachable applies the rule's on_unreachable (Config.OnUnreachable
// until a grant has brought the rule's own).
func (c *Client) unreachable(customer, meter string, cost int64, b *budget) (Decision, error) {
	d := Decision{How: Unreachable, Binding: b.binding, Unreachable: true, RetryAfter: c.retryIn(time.Now())}
	p := policy{how: c.cfg.OnUnreachable, amount: c.cfg.LocalAmount, every: c.cfg.LocalEvery}
	if learnt := b.policy.Load(); learnt != nil {
		p = *learnt
	}
	switch p.how {
	case Allow:
	case Local:
		if p.every <= 0 || !b.local.take(cost, p.amount, p.every, time.Now()) {
			return d, nil
		}
	default:
		return d, nil
	}
	if err := c.journal.append(customer, meter, cost, time.Now()); err != nil {
		// Not on disk, so not admitted: a bypass must never go unrecorded.
		return d, fmt.Errorf("admit: record bypass: %w", err)
	}
	d.Admitted, d.How, d.RetryAfter = true, Bypass, 0
	return d, nil
}

// checkIDs: a customer or meter that is not an id is the caller's mistake,
// said at once; asking Tally would spend a call (and the gateway token's
// rate limit, which every customer's grants share) on a 400.
func checkIDs(customer, meter string) error {
	for _, id := range []struct{ field, v string }{{"customer", customer}, {"meter", meter}} {
		if !ids.Valid(id.v) {
			return fmt.Errorf("admit: %s %.64q is not %s", id.field, id.v, ids.Rule)
		}
	}
	return nil
}

// budget returns the budget of customer and meter, adding it.
func (c *Client) budget(customer, meter string) *budget {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := key{customer, meter}
	if b := c.budgets.load(k); b != nil {
		return b
	}
	b := newBudget(customer, meter)
	if p, ok := c.learnt[k]; ok { // forgotten before, with its rule's policy
		b.policy.Store(&p)
		delete(c.learnt, k)
	}
	// Under decMu: a decision read meanwhile is either handed over here
	// or finds b in the map.
	c.decMu.Lock()
	if l := c.decisions[k]; l != nil {
		b.dec.Store(l)
	}
	c.budgets.store(k, b)
	c.decMu.Unlock()
	return b
}

// hold returns b (the budget of customer and meter, or nil), or the one
// in the map if b was forgotten meanwhile, counted as used by one more
// Admit of the slow path: it is not forgotten until users drops to 0.
// An Admit counts itself in users, then checks forgotten; forget sets
// forgotten, then checks users: one of them sees the other.
func (c *Client) hold(customer, meter string, b *budget) *budget {
	for {
		if b == nil {
			b = c.budget(customer, meter)
		}
		b.users.Add(1)
		if !b.forgotten.Load() {
			return b
		}
		b.users.Add(-1)
		b = nil
	}
}

// forgetIdle forgets the budgets of bs still idle (forgettable) now: they
// leave the map, and their hot-path counts go to the client's metrics.
// One map shard at a time: c.mu, which every new customer's Admit takes,
// is held for a shard's budgets, never for all of them (100,000 budgets
// idle together held it for 100-450 ms, past MaxWait).
func (c *Client) forgetIdle(bs []*budget) {
	byShard := map[int][]*budget{}
	for _, b := range bs {
		n := c.budgets.index(key{b.customer, b.meter})
		byShard[n] = append(byShard[n], b)
	}
	for _, bs := range byShard {
		c.forgetShard(bs)
	}
}

// forgetShard forgets the budgets of bs, all of one map shard, still
// idle now.
func (c *Client) forgetShard(bs []*budget) {
	// Before c.mu: a scrape in progress holds up the loop, never an
	// Admit adding a budget.
	c.metrics.retiring.Lock()
	defer c.metrics.retiring.Unlock()
	c.mu.Lock() // no budget is added meanwhile: the map holds b or none
	now := time.Now()
	var gone []*budget
	for _, b := range bs {
		if c.forget(b, now) {
			gone = append(gone, b)
		}
	}
	c.budgets.remove(gone)
	// The rule's on_unreachable a grant brought outlives its budget when
	// it is not the gateway's own: while Tally is unreachable, the
	// customer's next Admit follows its rule, not Config.OnUnreachable.
	def := policy{how: c.cfg.OnUnreachable, amount: c.cfg.LocalAmount, every: c.cfg.LocalEvery}
	for _, b := range gone {
		if p := b.policy.Load(); p != nil && *p != def {
			if c.learnt == nil {
				c.learnt = map[key]policy{}
			}
			c.learnt[key{b.customer, b.meter}] = *p
		}
	}
	c.mu.Unlock()
	for _, b := range gone {
		// An Admit on the hot path that loaded b before may still count
		// in its shards; a count that late is lost to the metrics.
		c.metrics.retire(b)
	}
}

// forget marks b forgotten if it is forgettable and no Admit of the slow
// path holds it. Nothing can then add capacity to it: a grant request
// starts only from the slow path, and none is in flight. A budget whose
// locks are taken is in use: forget does not wait for them, since c.mu is
// held meanwhile (a grant request holds b.mu across its call to Tally, and
// every new customer's Admit takes c.mu).
func (c *Client) forget(b *budget, now time.Time) bool {
	if !b.mu.TryLock() {
		return false
	}
	defer b.mu.Unlock()
	if !b.fmu.TryLock() {
		return false
	}
	defer b.fmu.Unlock()
	if !c.forgettable(b, now) || b.inflight != nil || b.waiting.Load() != 0 || b.available() != 0 ||
		len(b.sending) != 0 || now.UnixNano() < b.refusedUntil.Load() || b.tight(now) || c.localOpen(b, now) {
		return false
	}
	b.forgotten.Store(true)
	if b.users.Load() != 0 {
		b.forgotten.Store(false)
		return false
	}
	return true
}

// forgettable: no Admit has used b for ForgetAfter, and it holds no grant
// and no report to send. Under b.mu.
func (c *Client) forgettable(b *budget, now time.Time) bool {
	if u := b.uses(); u != b.usesSeen {
		b.usesSeen, b.usedAt = u, now
		return false
	}
	return now.Sub(b.usedAt) >= c.cfg.ForgetAfter && len(b.grants) == 0 && len(b.outbox) == 0
}

// localOpen: b's on_unreachable local allowance has admitted in a window
// that has not ended; forgetting b would start a new one.
func (c *Client) localOpen(b *budget, now time.Time) bool {
	every := c.cfg.LocalEvery
	if p := b.policy.Load(); p != nil {
		every = max(every, p.every)
	}
	b.local.mu.Lock()
	defer b.local.mu.Unlock()
	return b.local.used > 0 && now.Sub(b.local.window) < every
}

// Close gives back every held grant with its final spent, reports pending
// bypasses, and stops the background loop, within CloseTimeout (and ctx).
// Every final spend report is on disk first: those Tally did not take in
// time (it hangs, is down, or refuses for load) stay in Dir for the next
// Client on that directory to deliver, and Close returns an
// *UndeliveredError saying how many. Close never waits on a Tally known
// to be unreachable beyond writing those reports.
func (c *Client) Close(ctx context.Context) error {
	var err error
	c.closeOnce.Do(func() {
		// Before the grants go back: a top-up that takes a budget's lock
		// after its release sees it and asks for nothing, so no grant is
		// left live behind a closed client.
		c.fetchMu.Lock()
		c.closed.Store(true)
		c.fetchMu.Unlock()
		cctx, cancel := context.WithTimeout(ctx, c.cfg.CloseTimeout)
		defer cancel()
		// Grant requests in flight may still bring grants, which go back
		// below; past the bound, their calls are cut.
		stopAfter := context.AfterFunc(cctx, c.stopBG)
		defer stopAfter()
		defer c.stopBG()
		close(c.stop)
		<-c.done
		c.fetches.Wait()
		c.stopReader()
		c.readers.Wait()
		c.releaseAll(cctx)
		// Every report once, even while Tally counts as unreachable (it
		// may have come back since the last probe), then what it did not
		// take, honouring its pauses, until the bound.
		left, spent := c.deliverReports(cctx, true)
		for left > 0 && cctx.Err() == nil {
			wait := time.Duration(c.reach.pausedUntil.Load() - time.Now().UnixNano())
			if !pause.For(cctx, max(wait, c.cfg.Tick)) {
				break
			}
			left, spent = c.deliverReports(cctx, false)
		}
		if !c.paused(time.Now()) && cctx.Err() == nil {
			c.reportBypasses(cctx)
		}
		var undelivered error
		if left > 0 {
			undelivered = &UndeliveredError{Reports: left, Spent: spent, Dir: c.cfg.Dir}
			c.log.Warn("closed with final spend reports undelivered; the next run on this directory delivers them",
				"reports", left, "spent", spent, "dir", c.cfg.Dir)
		}
		err = errors.Join(undelivered, c.journal.close())
		if c.ownTransport != nil {
			c.ownTransport.CloseIdleConnections()
		}
		// Last, so the metrics count this Close's reports: a new client
		// may then register on the same registry.
		c.metrics.unregister()
	})
	return err
}

// shards is the number of capacity counters per budget: one per CPU, so
// concurrent Admit calls rarely touch the same cache line.
var shards = runtime.GOMAXPROCS(0)

type shard struct {
	avail atomic.Int64
	taken atomic.Int64 // admitted from grants, for the demand measure and metrics
	// Answers of a lagged rule (or none), for metrics.
	decAdmitted, decRefused, noRule atomic.Int64
	_                               [24]byte
}

type budget struct {
	customer, meter, binding string
	shards                   []shard
	misses                   atomic.Int64
	slowUses                 atomic.Int64           // Admits of the slow path, for uses
	users                    atomic.Int64           // Admits of the slow path holding b (hold)
	forgotten                atomic.Bool            // b left the map (forget)
	refusedUntil             atomic.Int64           // unix nanos
	refusedNeed              atomic.Int64           // the least of what the remembered refusals asked for
	refusedBy                atomic.Pointer[string] // the binding budget of the last refusal
	local                    localBucket
	policy                   atomic.Pointer[policy] // the rule's on_unreachable, from the last grant
	kind                     atomic.Uint32          // kindUnknown, kindExact, kindLagged, kindNoRule
	dec                      atomic.Pointer[lagged] // the latest decision, for a lagged rule
	heldGrants               atomic.Int64           // len(grants), for metrics
	rateBudget               atomic.Bool            // its grants draw from a rate budget: short, never renewed

	fmu      sync.Mutex
	inflight *fetch // the grant request in flight, started by Admit
	// waiting is the cost of the Admits waiting for a grant request: the
	// loop never gives back capacity they are about to take.
	waiting atomic.Int64

	// Below: under mu (the slow path and the background loop).
	mu     sync.Mutex
	grants []*held // oldest first
	finals int64   // admitted from grants no longer held
	// outbox: final spend reports of grants given back, kept and sent once
	// mu is released (unlockAndSend).
	outbox []spendReport
	// sending is full, from under mu, from the first report's grant given
	// back (release) until the outbox's reports are sent: a top-up or a
	// debit that Tally refuses waits for them (up to MaxWait/2) and asks
	// again, so Tally has the capacity back before it is asked for more.
	sending   chan struct{}
	lastTaken int64
	lastAt    time.Time
	usesSeen  int64     // uses when the loop last found them changed,
	usedAt    time.Time // at usedAt
	checkedAt time.Time // when Tally last said the rule is not exact
	// tightUntil: a grant or debit came back refused, smaller than asked,
	// or with less than two lookaheads of demand left; until then an
	// Admit that finds nothing held is debited (debit.go), and a top-up
	// asks for its cost alone.
	tightUntil atomic.Int64 // unix nanos: read by Admit without b.mu
	refusals   atomic.Int64 // grant requests and debits refused in a row
	lastGrant  int64        // amount of the last grant issued
	// checkedVersion is the rule version last checked: of the decision
	// when Tally said the rule is not exact, of the newest grant else.
	// Written under mu; Admit reads it without (unchecked).
	checkedVersion atomic.Int64
	// rate is measured demand in thousandths of a unit per second,
	// smoothed: an estimate that only sizes the next grant request
	// (rounded up to whole units), never an amount admitted, granted or
	// reported. Integers, like every quantity here.
	rate int64
	// left is the available of the last grant answer, at leftAt; drain is
	// how fast it fell between answers at least a tick apart (thousandths
	// of a unit per second, smoothed), fell the last such reading: the
	// demand of all gateways, net of what they gave back. Estimates that
	// only decide whether the budget is tight.
	left   int64
	leftAt time.Time
	drain  int64
	fell   int64
}

type held struct {
	id         string
	amount     int64
	validUntil time.Time
	spent      int64     // last reported
	generation int64     // the holder's generation it was issued under
	rate       bool      // drew from a rate budget: renew never extends it
	spentAt    time.Time // when tend first found it fully spent (spentHold)
}

func (b *budget) tight(now time.Time) bool { return now.UnixNano() < b.tightUntil.Load() }

func newBudget(customer, meter string) *budget {
	return &budget{customer: customer, meter: meter, binding: "customer:" + customer + "/" + meter,
		shards: make([]shard, shards), lastAt: time.Now(), usedAt: time.Now(), sending: make(chan struct{}, 1)}
}

// uses counts b's Admits, for forgetting it: those answered on the hot
// path (counted in its shards) and on the slow path.
func (b *budget) uses() int64 {
	n := b.slowUses.Load()
	for i := range b.shards {
		s := &b.shards[i]
		n += s.taken.Load() + s.decAdmitted.Load() + s.decRefused.Load() + s.noRule.Load()
	}
	return n
}

// counted counts a lagged (or no-rule) answer of the hot path in one shard,
// for metrics (Admit counts the slow path's answers itself).
func (b *budget) counted(d Decision) Decision {
	s := &b.shards[int(rand.Uint32())%len(b.shards)]
	switch {
	case d.How == NoRule:
		s.noRule.Add(1)
	case d.Admitted:
		s.decAdmitted.Add(1)
	default:
		s.decRefused.Add(1)
	}
	return d
}

// take admits cost from one shard, trying the others when it is short,
// and when no shard holds cost alone, from several: capacity is spread
// over the shards, and an Admit of all that is held must not be refused.
// What it gathered goes back when the shards together hold less than
// cost.
func (b *budget) take(cost int64) bool {
	n := len(b.shards)
	start := int(rand.Uint32()) % n
	for i := range n {
		s := &b.shards[(start+i)%n]
		for {
			v := s.avail.Load()
			if v < cost {
				break
			}
			if s.avail.CompareAndSwap(v, v-cost) {
				s.taken.Add(cost)
				return true
			}
		}
	}
	if n == 1 {
		return false
	}
	got := b.withdraw(cost)
	if got == cost {
		b.shards[start].taken.Add(cost)
		return true
	}
	b.add(got)
	return false
}

// add spreads capacity over the shards.
func (b *budget) add(amount int64) {
	n := int64(len(b.shards))
	per, rest := amount/n, amount%n
	for i := range b.shards {
		v := per
		if int64(i) < rest {
			v++
		}
		b.shards[i].avail.Add(v)
	}
}

// withdraw takes back up to amount of unadmitted capacity and returns how
// much it took.
func (b *budget) withdraw(amount int64) int64 {
	var got int64
	for i := range b.shards {
		s := &b.shards[i]
		for got < amount {
			v := s.avail.Load()
			if v <= 0 {
				break
			}
			t := min(v, amount-got)
			if s.avail.CompareAndSwap(v, v-t) {
				got += t
			}
		}
	}
	return got
}

func (b *budget) available() int64 {
	var s int64
	for i := range b.shards {
		s += b.shards[i].avail.Load()
	}
	return s
}

func (b *budget) taken() int64 {
	var s int64
	for i := range b.shards {
		s += b.shards[i].taken.Load()
	}
	return s
}

// policy is an on_unreachable setting.
type policy struct {
	how    Policy
	amount int64
	every  time.Duration
}

// localBucket is the bounded fallback of policy Local.
type localBucket struct {
	mu     sync.Mutex
	window time.Time
	used   int64
}

func (l *localBucket) take(cost, amount int64, every time.Duration, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.window) >= every {
		l.window, l.used = now, 0
	}
	if l.used+cost > amount {
		return false
	}
	l.used += cost
	return true
}
