package api

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tally-ledger/tally/internal/notify"
)

// The usage cache keeps answers read from Postgres for as long as they are
// true. Migration 00007's triggers notify channel tally_api_cache, at commit,
// of every customer whose rollups, closes or partition mapping changed
// (00032 and 00044: gauges and unique meters; 00043: any declaration),
// and of every move of an ingest position; Run listens (internal/notify,
// with this cache and the token cache as subscribers) and forgets the
// customers' answers as it is told. So a cached answer is never staler
// than a fresh read would be, except for the moment it takes a
// notification to arrive, and its as_of is then honest too:
//
//   - An answer read in snapshot S stays cached only while no notification
//     since its read began named its customer (a read that overlaps one is
//     not cached: the stamp check in get/put).
//   - Notifications arrive in commit order. A position's move is only a
//     hint (any database login can NOTIFY the channel): the listener reads
//     the positions from ingest_partitions and uses them once it has heard
//     every notification of the commits that read saw (positionRead). When
//     the position of the customer's partition is A, every commit up to A
//     has been heard, none of those after S touched the customer, so the
//     answer is the customer's usage as of A: a hit reports as_of A (or
//     the as_of it was read with, if later), not the older one it was read
//     with. get reads the positions before the answer, for the same reason.
//   - The cache is used only while the listening connection is up and was
//     set up before the answers were read: it is emptied and every read
//     in flight refused when the connection is (re)established or lost.
//     And only while the listener is live: it heard a probe sent within
//     its lease, and Postgres's notification queue is not filling
//     (internal/notify).
//
// Writes through this process (adjustments, closes, calendar changes,
// replays) also forget at once, so a client reads its own writes.
// Answers are dropped after UsageCacheTTL anyway, and the cache is bounded
// in bytes: when full, customers chosen at random are dropped until half
// of it is free.

// usageStampBuckets spreads customers over invalidation counters: a read
// is refused when its customer's bucket moved during the read. More
// buckets, fewer refusals caused by other customers.
const usageStampBuckets = 4096

// listenerState is what the caches need of the listener (a
// *notify.Listener): its epoch (even while listening, changed on every
// (re)connection and loss) and whether it is live.
type listenerState interface {
	Epoch() uint64
	Up() bool
	Live() bool
}

// usageWatch is the usage cache, a subscriber of the listener, shared with
// the request handlers.
type usageWatch struct {
	topic     string
	seed      maphash.Seed
	l         listenerState
	gen       atomic.Uint64 // forgetAll calls
	stamps    [usageStampBuckets]atomic.Uint64
	positions atomic.Pointer[map[int32]pgtype.Timestamptz] // partition → applied_through, of topic
	cache     usageCache
	onSync    func(string) // tests: a {"sync": ...} notification arrived
	// positionDelay is a pause after each read of the positions is used
	// (tests: makes a mis-ordered notification visible).
	positionDelay time.Duration
	pr            positionRead // the listener's goroutine only
}

func newUsageWatch(topic string, l listenerState, ttl time.Duration, maxBytes int) *usageWatch {
	w := &usageWatch{topic: topic, seed: maphash.MakeSeed(), l: l}
	w.cache = usageCache{ttl: ttl, maxBytes: maxBytes, m: map[string][]usageEntry{}}
	return w
}

// usageTicket is taken before a read: the read may be cached if the
// ticket is still good after it.
type usageTicket struct{ epoch, gen, stamp uint64 }

func (w *usageWatch) bucket(customer string) *atomic.Uint64 {
	return &w.stamps[maphash.String(w.seed, customer)%usageStampBuckets]
}

func (w *usageWatch) ticket(customer string) usageTicket {
	return usageTicket{epoch: w.l.Epoch(), gen: w.gen.Load(), stamp: w.bucket(customer).Load()}
}

// good reports whether nothing was forgotten of customer since t, and the
// listener was up all along.
func (w *usageWatch) good(t usageTicket, customer string) bool {
	return t.epoch%2 == 0 && w.l.Live() && w.l.Epoch() == t.epoch && w.gen.Load() == t.gen && w.bucket(customer).Load() == t.stamp
}

// get returns a cached answer, its as_of advanced to what the
// notifications have shown since it was read.
func (w *usageWatch) get(key usageKey, now time.Time) (usageData, bool) {
	if w.cache.ttl <= 0 || !w.l.Up() || !w.l.Live() {
		return usageData{}, false
	}
	// The positions first, then the answer: a position is published only
	// after every commit through it has forgotten what it changed, so an
	// answer still cached after the position was read holds all of it. The
	// other order could stamp an answer read before a commit with that
	// commit's position.
	positions := w.positions.Load()
	d, ok := w.cache.get(key, now)
	if !ok {
		return usageData{}, false
	}
	if pos := positionOf(positions, d.partition); pos.Valid && (!d.asOf.Valid || pos.Time.After(d.asOf.Time)) {
		d.asOf = pos
	}
	return d, true
}

// put caches an answer read under ticket t, if t is still good.
func (w *usageWatch) put(t usageTicket, key usageKey, d usageData, now time.Time) {
	if w.cache.ttl <= 0 {
		return
	}
	w.cache.put(key, d, now, func() bool { return w.good(t, key.customer) })
}

// positionOf is the applied_through usage's as_of comes from: the
// partition's (in positions m), or for a customer ingest has not seen (-1) the oldest of
// the topic's, if every partition has one. As the usage statement does.
func positionOf(m *map[int32]pgtype.Timestamptz, partition int32) pgtype.Timestamptz {
	if m == nil {
		return pgtype.Timestamptz{}
	}
	if partition >= 0 {
		return (*m)[partition]
	}
	var oldest pgtype.Timestamptz
	for _, p := range *m {
		if !p.Valid {
			return pgtype.Timestamptz{}
		}
		if !oldest.Valid || p.Time.Before(oldest.Time) {
			oldest = p
		}
	}
	return oldest
}

// publish makes positions (read from ingest_partitions) the ones hits
// are stamped with. Only after every notification committed before they
// were read has been handled (see positionRead).
func (w *usageWatch) publish(positions map[int32]pgtype.Timestamptz) {
	w.positions.Store(&positions)
}

// forget drops customer's answers and refuses reads of it in flight.
func (w *usageWatch) forget(customer string) {
	w.bucket(customer).Add(1)
	w.cache.forget(customer)
}

// forgetAll drops every answer and refuses every read in flight.
func (w *usageWatch) forgetAll() {
	w.gen.Add(1)
	w.cache.clear()
}

// change is a tally_api_cache payload (migrations 00007 and 00012). Any
// database login can NOTIFY the channel, so a payload is only ever taken
// as "this changed": it can make the API forget, never believe. A
// position's value in particular is read from ingest_partitions, not
// from the payload.
type change struct {
	Tokens    []string `json:"tokens"` // the token cache's (tokens.Store)
	Customers []string `json:"customers"`
	Topic     *string  `json:"topic"` // a position of this topic moved
	Truncated string   `json:"truncated"`
	// PositionsRead marks the end of a read of the positions by this
	// listener (see positionRead); Sync is a test's barrier.
	PositionsRead string `json:"positions_read"`
	Sync          string `json:"sync"`
}

// apply forgets what one notification says changed, and returns it.
func (w *usageWatch) apply(payload string) (change, error) {
	var c change
	if err := json.Unmarshal([]byte(payload), &c); err != nil {
		return change{}, fmt.Errorf("%w: payload %.100q: %w", notify.ErrNotUnderstood, payload, err)
	}
	for _, customer := range c.Customers {
		w.forget(customer)
	}
	if c.Truncated != "" {
		w.forgetAll() // every answer may be gone
	}
	if c.Customers == nil && c.Tokens == nil && c.Topic == nil && c.Truncated == "" && c.PositionsRead == "" && c.Sync == "" {
		return change{}, fmt.Errorf("%w: payload %.100q: neither tokens, customers, a position, a truncation nor a sync", notify.ErrNotUnderstood, payload)
	}
	return c, nil
}

// positionRead is the listener's read of the positions. A notification
// says a position moved; the listener then reads every position of its
// topic from ingest_partitions (snapshot S) and, after the read, notifies
// the channel itself with a random marker. Every commit visible in S put
// its notifications in Postgres's queue before it became visible, so
// before the marker: when the listener hears its marker, it has forgotten
// everything those commits changed, and the positions read in S may
// stamp cached answers. One read is in flight at a time; moves heard
// meanwhile are covered by one more read after it.
type positionRead struct {
	marker    string // of the read in flight; "" when none
	positions map[int32]pgtype.Timestamptz
	again     bool     // a position moved after the read in flight began
	syncs     []string // test barriers heard while a read was in flight
}

// Listening reads the positions the cache starts from (on the listening
// connection, after LISTEN: a move after this read is notified) and
// empties the cache.
func (w *usageWatch) Listening(ctx context.Context, conn *pgx.Conn) error {
	positions, err := readPositions(ctx, conn, w.topic)
	if err != nil {
		return err
	}
	w.positions.Store(&positions)
	w.pr = positionRead{}
	w.cache.clear()
	return nil
}

// Stopped empties the cache: it is not used until the listener is back.
func (w *usageWatch) Stopped() {
	w.cache.clear()
	w.positions.Store(nil)
}

// Forget drops every answer and refuses every read in flight.
func (w *usageWatch) Forget() { w.forgetAll() }

// Handle forgets what a notification says changed and keeps the positions.
func (w *usageWatch) Handle(ctx context.Context, conn *pgx.Conn, n *pgconn.Notification) error {
	c, err := w.apply(n.Payload)
	if err != nil {
		return err
	}
	pr := &w.pr
	switch {
	case c.PositionsRead != "":
		// Only this connection's own marker (another login could send
		// one) of the read in flight.
		if n.PID != conn.PgConn().PID() || c.PositionsRead != pr.marker {
			return nil
		}
		w.publish(pr.positions)
		pr.marker, pr.positions = "", nil
		if d := w.positionDelay; d > 0 { // tests: widen the race window
			time.Sleep(d)
		}
		if pr.again {
			// A position moved after this read began: a sync heard
			// meanwhile is answered once the read that follows is in,
			// not with positions from before the move.
			return w.readPositions(ctx, conn)
		}
		for _, s := range pr.syncs {
			w.synced(s)
		}
		pr.syncs = nil
	case (c.Topic != nil && *c.Topic == w.topic) || c.Truncated != "":
		if pr.marker != "" {
			pr.again = true
			return nil
		}
		return w.readPositions(ctx, conn)
	case c.Sync != "":
		if pr.marker != "" { // answered once the positions are in
			pr.syncs = append(pr.syncs, c.Sync)
			return nil
		}
		w.synced(c.Sync)
	}
	return nil
}

// readPositions starts a read of the positions (see positionRead).
func (w *usageWatch) readPositions(ctx context.Context, conn *pgx.Conn) error {
	positions, err := readPositions(ctx, conn, w.topic)
	if err != nil {
		return err
	}
	w.pr.positions, w.pr.marker, w.pr.again = positions, rand.Text(), false
	_, err = conn.Exec(ctx, qNotify, usageChannel, `{"positions_read":"`+w.pr.marker+`"}`)
	return err
}

func readPositions(ctx context.Context, conn *pgx.Conn, topic string) (map[int32]pgtype.Timestamptz, error) {
	rows, err := conn.Query(ctx, qWatchPositions, topic)
	if err != nil {
		return nil, err
	}
	positions := map[int32]pgtype.Timestamptz{}
	var part int32
	var at pgtype.Timestamptz
	_, err = pgx.ForEachRow(rows, []any{&part, &at}, func() error {
		positions[part] = at
		return nil
	})
	return positions, err
}

// synced tells a test that a {"sync": s} notification was handled.
func (w *usageWatch) synced(s string) {
	if w.onSync != nil {
		w.onSync(s)
	}
}

// usageChannel is the channel the triggers notify (migration 00007).
const usageChannel = "tally_api_cache"

// Run keeps the usage and token caches coherent with Postgres (see
// usageWatch and internal/notify) until ctx ends: it listens on a
// connection of its own, and reconnects after a failure. Without Run the
// API reads every usage answer from Postgres, and trusts a checked token
// for TokenCacheTTL.
func (a *API) Run(ctx context.Context) error { return a.listener.Run(ctx) }

// usageEntry is one cached answer.
type usageEntry struct {
	key     usageKey
	d       usageData
	expires time.Time
	size    int
}

// usageCache maps customer → their cached answers (a customer has a few:
// a slice is smaller than a map, and less for the GC to scan), bounded in
// bytes.
type usageCache struct {
	ttl      time.Duration
	maxBytes int

	mu    sync.Mutex
	m     map[string][]usageEntry
	bytes int
}

func (c *usageCache) get(key usageKey, now time.Time) (usageData, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.m[key.customer] {
		if e.key == key {
			return e.d, now.Before(e.expires)
		}
	}
	return usageData{}, false
}

// put stores an answer if ok() holds, checked under the lock that forget
// takes, so a forget cannot slip between the check and the store.
func (c *usageCache) put(key usageKey, d usageData, now time.Time, ok func() bool) {
	size := 256 + len(key.customer) + len(key.meter)
	for _, it := range d.items {
		size += len(it.total) + len(it.json) + 64
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !ok() {
		return
	}
	if c.bytes+size > c.maxBytes {
		// Full: first the customers with no fresh answer (never served
		// again: nothing else removes them, and a cache serving more
		// customers than it holds over a TTL fills with them), then others
		// until half is free, in map order (random), so a few large
		// answers do not empty the whole cache.
		for customer, entries := range c.m {
			if !slices.ContainsFunc(entries, func(e usageEntry) bool { return now.Before(e.expires) }) {
				c.drop(customer)
			}
		}
		for customer := range c.m {
			if c.bytes+size <= c.maxBytes/2 {
				break
			}
			c.drop(customer)
		}
	}
	// Keep the customer's other answers that are still fresh.
	entries := c.m[key.customer][:0]
	for _, e := range c.m[key.customer] {
		if e.key != key && now.Before(e.expires) {
			entries = append(entries, e)
		} else {
			c.bytes -= e.size
		}
	}
	c.m[key.customer] = append(entries, usageEntry{key: key, d: d, expires: now.Add(c.ttl), size: size})
	c.bytes += size
}

func (c *usageCache) forget(customer string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drop(customer)
}

// drop forgets customer's answers; c.mu is held.
func (c *usageCache) drop(customer string) {
	for _, e := range c.m[customer] {
		c.bytes -= e.size
	}
	delete(c.m, customer)
}

func (c *usageCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.m)
	c.bytes = 0
}
