package api_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tally-ledger/tally/api"
)

// /readyz of a process without the REST API (serve --ingest, --enforce)
// answers anyone: it says what the process is not ready for, never the
// driver's error, which names the database role, database and hosts (the
// log has it), as the API's own /readyz does.
func TestReadyzOfAnIngestProcessNamesNoInternals(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://secret_role@127.0.0.1:1/secret_db?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var logged strings.Builder
	h := api.ReadyHandler(pool, slog.New(slog.NewTextHandler(&logged, nil)), func() []string { return []string{"ingest is starting: not registered as a member yet"} })
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	var p api.Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if p.Detail != "postgres is unreachable; ingest is starting: not registered as a member yet" {
		t.Errorf("detail %q", p.Detail)
	}
	if !strings.Contains(logged.String(), "secret_db") {
		t.Errorf("the log lacks the error: %s", logged.String())
	}
}
