package api

import (
	"context"
	_ "embed"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tally-ledger/tally/ingest"
	"github.com/tally-ledger/tally/migrations"
)

// healthz: the process is up and serving. It touches nothing else, so a
// database outage never gets a healthy process restarted.
func (a *API) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz: Postgres answers and its schema is the one this binary expects.
func (a *API) readyz(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	notReady := func(detail string) error {
		return &Problem{Type: TypeNotReady, Title: "Not ready", Status: http.StatusServiceUnavailable, Detail: detail}
	}
	if err := a.pool.Ping(ctx); err != nil {
		a.log.WarnContext(ctx, "readyz: postgres unreachable", "err", err)
		return notReady("postgres is unreachable")
	}
	current, latest, err := migrations.Status(ctx, a.pool)
	if err != nil {
		a.log.WarnContext(ctx, "readyz: schema version", "err", err)
		return notReady("cannot read the schema version")
	}
	if current != latest {
		return notReady(fmt.Sprintf("schema version %d, this binary needs %d: run `tally migrate`", current, latest))
	}
	if detail, err := a.unownedPartitions(ctx); err != nil {
		a.log.WarnContext(ctx, "readyz: ingest partition owners", "err", err)
		return notReady("cannot read the ingest partitions' owners")
	} else if detail != "" {
		return notReady(detail)
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "schema_version": current})
	return nil
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
