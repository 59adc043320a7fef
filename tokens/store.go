package tokens

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tally-ledger/tally/internal/notify"
	"github.com/tally-ledger/tally/internal/ttlcache"
)

// Principal is who a verified token speaks for: one customer (read only)
// or one gateway holder.
type Principal struct {
	TokenID  uuid.UUID
	Customer string // a customer token's customer; "" for a gateway token
	Gateway  string // a gateway token's holder id; "" for a customer token
}

// ErrUnknown: the secret is not a live token (malformed, unknown or
// revoked). Verify's other errors are Postgres failing.
var ErrUnknown = errors.New("the token is unknown or revoked")

// Check is how Verify decided, for a metric.
type Check string

// The checks Verify makes.
const (
	Cached        Check = "cached"         // a cached, trusted token
	RefusedCached Check = "refused_cached" // a secret refused before, remembered
	Queried       Check = "queried"        // asked Postgres
	Malformed     Check = "malformed"      // Prefix, but not Create's shape
)

// Config configures a Store. Only DB is required.
type Config struct {
	// DB is where tokens are read (the caller's pool).
	DB DBTX
	// CacheTTL is how long a verified token is trusted without asking
	// Postgres while revocations cannot be heard (see the package doc).
	// 0: 5s; negative: never cached.
	CacheTTL time.Duration
	// FailedTTL is how long a well-formed secret Postgres did not know is
	// refused without a query. 0: a minute.
	FailedTTL time.Duration
	// Listener, if set, hears revocations (the API's change listener); Store
	// subscribes to it in New, so it must not be running yet. Without it a
	// token is trusted for CacheTTL only.
	Listener *notify.Listener
	// OnCheck, if set, is called with how each Verify decided.
	OnCheck func(Check)
}

// coherentTTL is how long a verified token is trusted while revocations
// are heard.
const coherentTTL = time.Minute

// knownTTL is how long KnownGateway remembers a verified gateway token,
// and knownUnheardTTL how long after its last check while revocations
// cannot be heard (see KnownGateway).
const (
	knownTTL        = time.Hour
	knownUnheardTTL = time.Minute
)

// Store verifies token secrets, caching what Postgres said.
type Store struct {
	db      DBTX
	ttl     time.Duration
	l       listenerState // nil: revocations are not heard
	cache   *ttlcache.Cache[[32]byte, cached]
	refused *ttlcache.Cache[[32]byte, struct{}]
	known   *ttlcache.Cache[[32]byte, cached] // gateway tokens, for KnownGateway; refreshed by every Verify
	watch   *watch
	onCheck func(Check)
}

// listenerState is what trust needs of the change listener.
type listenerState interface {
	Epoch() uint64
	Live() bool
}

// cached is a verified token, with when it was read and the listener's
// epoch then (even: revocations were being heard).
type cached struct {
	p     Principal
	epoch uint64
	read  time.Time
}

// New returns a Store.
func New(cfg Config) (*Store, error) {
	if cfg.DB == nil {
		return nil, errors.New("tokens: Config.DB is nil")
	}
	s := &Store{db: cfg.DB, ttl: cfg.CacheTTL, onCheck: cfg.OnCheck}
	if s.ttl == 0 {
		s.ttl = 5 * time.Second
	}
	cacheTTL := max(s.ttl, coherentTTL)
	if s.ttl < 0 {
		cacheTTL = s.ttl // off
	}
	failed := cfg.FailedTTL
	if failed == 0 {
		failed = time.Minute
	}
	s.cache = ttlcache.New[[32]byte, cached](cacheTTL, 100_000)
	s.refused = ttlcache.New[[32]byte, struct{}](failed, 100_000)
	s.known = ttlcache.New[[32]byte, cached](knownTTL, 100_000)
	s.watch = &watch{caches: []*ttlcache.Cache[[32]byte, cached]{s.cache, s.known}}
	if cfg.Listener != nil {
		s.l = cfg.Listener
		cfg.Listener.Subscribe(s.watch)
	}
	if s.onCheck == nil {
		s.onCheck = func(Check) {}
	}
	return s, nil
}

// Verify returns the principal of a live token's secret, or ErrUnknown.
func (s *Store) Verify(ctx context.Context, secret string) (Principal, error) {
	if !WellFormed(secret) {
		if strings.HasPrefix(secret, Prefix) {
			s.onCheck(Malformed)
		}
		return Principal{}, ErrUnknown
	}
	h := sha256.Sum256([]byte(secret))
	// Only if no revocation was heard since (it might have been this one).
	stamp := s.watch.stamp.Load()
	unchanged := func() bool { return s.watch.stamp.Load() == stamp }
	if c, ok := s.cache.Get(h); ok && s.trusted(c) {
		s.onCheck(Cached)
		s.remember(h, c, unchanged)
		return c.p, nil
	}
	if _, refused := s.refused.Get(h); refused {
		s.onCheck(RefusedCached)
		s.known.Del(h)
		return Principal{}, ErrUnknown
	}
	s.onCheck(Queried)
	var epoch uint64
	if s.l != nil {
		epoch = s.l.Epoch()
	} else {
		epoch = 1 // odd: not heard
	}
	read := time.Now()
	var p Principal
	var id pgtype.UUID // not uuid.UUID: pgx would go through its text form
	err := s.db.QueryRow(ctx, qTokenByHash, h[:]).Scan(&id, &p.Customer, &p.Gateway)
	p.TokenID = id.Bytes
	if errors.Is(err, pgx.ErrNoRows) {
		s.refused.Put(h, struct{}{})
		s.known.Del(h)
		return Principal{}, ErrUnknown
	}
	if err != nil {
		return Principal{}, fmt.Errorf("tokens: verify: %w", err)
	}
	c := cached{p: p, epoch: epoch, read: read}
	s.cache.PutIf(h, c, unchanged)
	s.remember(h, c, unchanged)
	return p, nil
}

// remember keeps a verified gateway token for KnownGateway, if unchanged
// still holds.
func (s *Store) remember(h [32]byte, c cached, unchanged func() bool) {
	if c.p.Gateway != "" {
		s.known.PutIf(h, c, unchanged)
	}
}

// KnownGateway reports whether secret is a gateway token this Store
// verified, and its holder, without asking Postgres: for deciding before
// any other work whom a request comes from (the API spares known gateways
// its per-address limits; it still authenticates them). A gateway token
// is known from its last Verify on for up to an hour while revocations
// are heard (a revocation heard, or Verify refusing it, forgets it at
// once), and otherwise for a minute after its last check (or CacheTTL, if
// longer): not as briefly as Verify trusts it without asking, since this
// grants access to nothing, but never for long after a revocation no one
// heard.
func (s *Store) KnownGateway(secret string) (string, bool) {
	if !WellFormed(secret) {
		return "", false
	}
	c, ok := s.known.Get(sha256.Sum256([]byte(secret)))
	if !ok || !(s.trusted(c) || time.Since(c.read) < knownUnheardTTL) {
		return "", false
	}
	return c.p.Gateway, true
}

// trusted reports whether a cached token may be used without asking
// Postgres: within CacheTTL of its read, or for longer while every
// revocation since its read has been heard (the listener has been up
// throughout, so its epoch has not changed) and the listener is live (it
// heard a probe sent within its lease: a listener that died silently is
// not trusted for longer).
func (s *Store) trusted(c cached) bool {
	if s.ttl > 0 && time.Since(c.read) < s.ttl {
		return true
	}
	return s.l != nil && c.epoch%2 == 0 && s.l.Epoch() == c.epoch && s.l.Live()
}

// watch is the token caches' subscriber: a revoked or deleted token is
// dropped when its notification arrives (the api_tokens trigger,
// migrations 00007 and 00012).
type watch struct {
	// stamp counts revocations heard: a token read while one was heard
	// is not cached (it might have been this one; see Verify).
	stamp  atomic.Uint64
	caches []*ttlcache.Cache[[32]byte, cached]
}

func (t *watch) Listening(context.Context, *pgx.Conn) error { return nil }

// Stopped keeps the tokens: beyond CacheTTL they are trusted only while
// the listener's epoch is the one they were read in (trusted).
func (t *watch) Stopped() {}

// Forget drops every token.
func (t *watch) Forget() {
	t.stamp.Add(1)
	for _, c := range t.caches {
		c.Clear()
	}
}

func (t *watch) Handle(_ context.Context, _ *pgx.Conn, n *pgconn.Notification) error {
	var c struct {
		Tokens    []string `json:"tokens"`
		Truncated string   `json:"truncated"`
	}
	if err := json.Unmarshal([]byte(n.Payload), &c); err != nil {
		return fmt.Errorf("%w: payload %.100q: %w", notify.ErrNotUnderstood, n.Payload, err)
	}
	for _, tok := range c.Tokens {
		var h [32]byte
		if k, err := hex.Decode(h[:], []byte(tok)); err != nil || k != len(h) {
			return fmt.Errorf("%w: payload %.100q: token hash %.80q", notify.ErrNotUnderstood, n.Payload, tok)
		}
		t.stamp.Add(1)
		for _, c := range t.caches {
			c.Del(h)
		}
	}
	if c.Truncated != "" {
		t.Forget() // every token may be gone
	}
	return nil
}
