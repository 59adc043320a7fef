package notify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNotUnderstood wraps a Subscriber's error about a payload it cannot
// read (every subscriber then forgets everything); any other error from
// Handle ends the connection.
var ErrNotUnderstood = errors.New("notification not understood")

// Subscriber is told of the listener's state and handed each notification.
// Listening and Handle are called from the listener's goroutine, one at a
// time; Stopped and Forget may also come from the watchdog's, concurrently
// with them.
type Subscriber interface {
	// Listening is called after LISTEN on each (re)connection, before the
	// epoch turns even and before any notification: read the starting
	// state on conn here (everything committed after the read is
	// notified).
	Listening(ctx context.Context, conn *pgx.Conn) error
	// Handle handles one notification. conn is the listening connection:
	// a subscriber may run statements on it (notifications arriving
	// meanwhile wait) and notify itself (n.PID == conn.PgConn().PID()
	// tells its own notifications). See ErrNotUnderstood.
	Handle(ctx context.Context, conn *pgx.Conn, n *pgconn.Notification) error
	// Stopped is called when listening stops, after the epoch turned odd.
	Stopped()
	// Forget drops everything the subscriber holds: notifications may have
	// been skipped (the queue was filling) or misunderstood.
	Forget()
}

// Config configures a Listener.
type Config struct {
	Pool            *pgxpool.Pool // its connection settings; probes use it
	Channel         string        // a constant identifier, never input
	ApplicationName string        // of the listening connection
	Logger          *slog.Logger
	// Called (if set) as the listener goes up or down, drops a listener
	// that fell behind, and reads the queue's usage.
	OnState      func(up bool)
	OnDropped    func()
	OnQueueUsage func(float64)
}

// Listener is one LISTEN connection and its subscribers.
type Listener struct {
	cfg  Config
	subs []Subscriber

	// Timings, changed (tests) before Run. PingEvery: a quiet connection
	// is pinged after this long.
	ProbeEvery, Lease, BehindLimit, PingEvery time.Duration
	// Hold, if set, is called before each notification is handled (tests:
	// a listener that hangs).
	Hold func()

	epoch      atomic.Uint64
	stateMu    sync.Mutex
	alive      atomic.Int64 // unix ns: when the newest probe heard was sent
	probesMu   sync.Mutex
	probes     map[string]probe // sent, not yet heard
	conn       atomic.Pointer[net.Conn]
	queueUsage atomic.Uint64 // float64 bits
	queueHigh  atomic.Bool   // at least half of tally.notify_queue_limit
}

// probe is one sent by the watchdog; committed once its NOTIFY has.
type probe struct {
	sent      time.Time
	committed bool
}

// New returns a listener that is down until Run has connected.
func New(cfg Config) *Listener {
	l := &Listener{cfg: cfg, probes: map[string]probe{},
		ProbeEvery: time.Second, Lease: 5 * time.Second, BehindLimit: 30 * time.Second, PingEvery: 15 * time.Second}
	l.epoch.Store(1)
	return l
}

// Subscribe adds s. Call it before Run.
func (l *Listener) Subscribe(s Subscriber) { l.subs = append(l.subs, s) }

// Epoch is even while listening, odd while not; it changes on every
// (re)connection and loss.
func (l *Listener) Epoch() uint64 { return l.epoch.Load() }

// Up reports whether the listener is connected.
func (l *Listener) Up() bool { return l.epoch.Load()%2 == 0 }

// Live reports whether the listener has heard a probe sent within Lease,
// and notifications are not being skipped.
func (l *Listener) Live() bool {
	return !l.queueHigh.Load() && time.Since(time.Unix(0, l.alive.Load())) < l.Lease
}

// QueueUsage is the last pg_notification_queue_usage() read, 0 to 1.
func (l *Listener) QueueUsage() float64 { return math.Float64frombits(l.queueUsage.Load()) }

// setState turns the epoch even (up) or odd.
func (l *Listener) setState(up bool) {
	l.stateMu.Lock()
	defer l.stateMu.Unlock()
	if l.Up() == up {
		return
	}
	if up {
		l.heardAt(time.Now())
	} else {
		l.forgetProbes()
	}
	l.epoch.Add(1)
	if !up {
		for _, s := range l.subs {
			s.Stopped()
		}
	}
	if l.cfg.OnState != nil {
		l.cfg.OnState(up)
	}
}

// Run listens until ctx ends, reconnecting after a failure, and probes
// the listener (see the package doc).
func (l *Listener) Run(ctx context.Context) error {
	wctx, stop := context.WithCancel(ctx)
	dog := make(chan struct{})
	go func() {
		defer close(dog)
		l.watchdog(wctx)
	}()
	defer func() {
		stop()
		<-dog
	}()
	backoff := 100 * time.Millisecond
	for {
		start := time.Now()
		err := l.listen(ctx)
		l.setState(false)
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(start) > time.Minute {
			backoff = 100 * time.Millisecond
		}
		l.cfg.Logger.Warn("usage cache off: change notifications lost; reconnecting", "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// probePrefix starts a probe's payload: {"probe":"<random>"}.
const probePrefix = `{"probe":"`

func (l *Listener) listen(ctx context.Context) error {
	cfg := l.cfg.Pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = l.cfg.ApplicationName
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	nc := conn.PgConn().Conn()
	l.conn.Store(&nc)
	defer l.conn.Store(nil)
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.cfg.Channel}.Sanitize()); err != nil {
		return err
	}
	// Listening first, then the starting state: a change after its read
	// is notified (and handled in order after it).
	for _, s := range l.subs {
		if err := s.Listening(ctx, conn); err != nil {
			return err
		}
	}
	l.setState(true)
	l.cfg.Logger.Info("usage cache on: listening for changes", "channel", l.cfg.Channel)
	for {
		// A connection that died silently would never say so: after a
		// quiet spell, a round trip proves it is alive.
		wctx, cancel := context.WithTimeout(ctx, l.PingEvery)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) && !conn.IsClosed() {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err = conn.Ping(pctx)
			cancel()
			if err != nil {
				return fmt.Errorf("ping: %w", err)
			}
			continue
		}
		if err != nil {
			return err
		}
		if l.Hold != nil {
			l.Hold()
		}
		if id, ok := strings.CutPrefix(n.Payload, probePrefix); ok {
			l.heard(strings.TrimSuffix(id, `"}`))
			continue
		}
		for _, s := range l.subs {
			if err = s.Handle(ctx, conn, n); err != nil {
				break
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, ErrNotUnderstood):
			// Forget everything rather than guess.
			l.cfg.Logger.Error("usage cache: unexpected notification; emptied the cache", "err", err)
			l.forgetAll()
		default:
			return err // the connection's
		}
	}
}

func (l *Listener) forgetAll() {
	for _, s := range l.subs {
		s.Forget()
	}
}

// Waker is a Subscriber that only wakes a loop: each notification, each
// (re)connection and each Forget sends on c without blocking (c should
// have a buffer of one). Notifications are a hint; the woken loop reads
// what it needs from the tables.
func Waker(c chan struct{}) Subscriber { return waker{c} }

type waker struct{ c chan struct{} }

func (w waker) poke() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}
func (w waker) Listening(context.Context, *pgx.Conn) error { w.poke(); return nil }
func (w waker) Handle(context.Context, *pgx.Conn, *pgconn.Notification) error {
	w.poke()
	return nil
}
func (w waker) Stopped() {}
func (w waker) Forget()  { w.poke() }
