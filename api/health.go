package api

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/migrations"
)

// healthz: the process is up and serving. It touches nothing else, so a
// database outage never gets a healthy process restarted.
func (a *API) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyCache holds /readyz's last answer: under a flood of probes the
// process asks Postgres at most once per readyFor (concurrent probes wait
// for the one asking).
type readyCache struct {
	mu      sync.Mutex
	at      time.Time
	version int64
	err     error
}

const readyFor = time.Second

// readyz: Postgres answers and its schema is the one this binary expects.
func (a *API) readyz(w http.ResponseWriter, r *http.Request) error {
	c := &a.ready
	c.mu.Lock()
	if c.at.IsZero() || time.Since(c.at) >= readyFor {
		// Not the probe's context: one that hangs up must not leave a
		// failure for the others to read.
		c.version, c.err = a.checkReady(context.WithoutCancel(r.Context()))
		c.at = time.Now()
	}
	version, err := c.version, c.err
	c.mu.Unlock()
	if err != nil {
		return err
	}
	if detail := notReadyFor(a.readyAlso); detail != "" {
		return &Problem{Type: TypeNotReady, Title: "Not ready", Status: http.StatusServiceUnavailable, Detail: detail}
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "schema_version": version})
	return nil
}

func (a *API) checkReady(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	notReady := func(detail string) error {
		return &Problem{Type: TypeNotReady, Title: "Not ready", Status: http.StatusServiceUnavailable, Detail: detail}
	}
	if err := a.pool.Ping(ctx); err != nil {
		a.log.WarnContext(ctx, "readyz: postgres unreachable", "err", err)
		return 0, notReady("postgres is unreachable")
	}
	current, latest, err := migrations.Status(ctx, a.pool)
	if err != nil {
		a.log.WarnContext(ctx, "readyz: schema version", "err", err)
		return 0, notReady("cannot read the schema version")
	}
	if current != latest {
		return 0, notReady(fmt.Sprintf("schema version %d, this binary needs %d: run `tally migrate`", current, latest))
	}
	if detail, err := stalledIngest(ctx, a.pool); err != nil {
		a.log.WarnContext(ctx, "readyz: ingest status", "err", err)
		return 0, notReady("cannot read the ingest status")
	} else if detail != "" {
		return 0, notReady(detail)
	}
	if detail, err := a.unownedPartitions(ctx); err != nil {
		a.log.WarnContext(ctx, "readyz: ingest partition owners", "err", err)
		return 0, notReady("cannot read the ingest partitions' owners")
	} else if detail != "" {
		return 0, notReady(detail)
	}
	return current, nil
}

// notReadyFor joins what the checks are not ready for ("" when ready).
func notReadyFor(checks []func() []string) string {
	var all []string
	for _, check := range checks {
		all = append(all, check()...)
	}
	return strings.Join(all, "; ")
}

// ReadyHandler serves /readyz for a process that runs no REST API (tally
// serve --ingest, --enforce): 200 while Postgres answers through pool and
// no check reports anything, else 503 problem+json saying what the process
// is not ready for. Postgres is asked at most once a second; its error goes
// to log, not to the answer (anyone may ask, and the driver's error names
// the role, database and host).
func ReadyHandler(pool *pgxpool.Pool, log *slog.Logger, checks ...func() []string) http.Handler {
	var mu sync.Mutex
	var at time.Time
	var pingErr error
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if at.IsZero() || time.Since(at) >= readyFor {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 2*time.Second)
			err := pool.Ping(ctx)
			if err != nil && (pingErr == nil || err.Error() != pingErr.Error()) {
				log.Warn("readyz: postgres unreachable", "err", err) // once while the error stays the same
			}
			pingErr = err
			cancel()
			at = time.Now()
		}
		err := pingErr
		mu.Unlock()
		var reasons []string
		if err != nil {
			reasons = append(reasons, "postgres is unreachable")
		}
		if detail := notReadyFor(checks); detail != "" {
			reasons = append(reasons, detail)
		}
		if len(reasons) > 0 {
			writeProblem(w, &Problem{Type: TypeNotReady, Title: "Not ready", Status: http.StatusServiceUnavailable,
				Detail: strings.Join(reasons, "; ")})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
}

// stalledIngest names the partitions whose micro-batch has been retried for
// longer than ingest.StallAfter (their usage is not being applied), or
// returns "" when there are none.
func stalledIngest(ctx context.Context, db ingest.DBTX) (string, error) {
	st, err := ingest.Status(ctx, db, "")
	if err != nil {
		return "", err
	}
	var stalled []string
	for _, s := range st {
		if s.State == "stalled" {
			stalled = append(stalled, fmt.Sprintf("%s/%d retrying since %s (last error: %s)",
				s.Topic, s.Partition, s.RetryingSince.Format(time.RFC3339), s.LastError))
		}
	}
	if len(stalled) == 0 {
		return "", nil
	}
	return "ingest stalled, usage is not being applied on partition " + strings.Join(stalled, "; partition ") +
		"; see /v1/ingest/status and the ingest log", nil
}

// unownedPartitions describes the ingest partitions that have had no live
// owner for a.unowned ("" when there are none, or the check is off).
func (a *API) unownedPartitions(ctx context.Context) (string, error) {
	if a.unowned < 0 {
		return "", nil
	}
	ps, err := ingest.Unowned(ctx, a.pool, a.topic, a.unowned)
	if err != nil || len(ps) == 0 {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d partition(s) of %s without a live ingest owner for over %s:", len(ps), a.topic, a.unowned)
	for _, p := range ps {
		if p.Since != nil {
			fmt.Fprintf(&b, " %d (since %s)", p.Partition, p.Since.Format(time.RFC3339))
		} else {
			fmt.Fprintf(&b, " %d", p.Partition)
		}
	}
	b.WriteString("; start or check the `tally serve --ingest` processes")
	return b.String(), nil
}

//go:embed openapi.json
var openapiDoc []byte

// OpenAPI returns the OpenAPI 3.1 document of this API.
func OpenAPI() []byte { return append([]byte(nil), openapiDoc...) }

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=300")
	_, _ = w.Write(openapiDoc)
}
