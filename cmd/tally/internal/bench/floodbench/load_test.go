package floodbench_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/tally-ledger/tally/cmd/tally/internal/bench/floodbench"
)

// recorder is a server that refuses every request and remembers what each
// one asked.
type recorder struct {
	mu      sync.Mutex
	tokens  map[string]int
	methods map[string]int
	paths   map[string]int
}

func newRecorder(t *testing.T) (*recorder, string) {
	r := &recorder{tokens: map[string]int{}, methods: map[string]int{}, paths: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.tokens[req.Header.Get("Authorization")]++
		r.methods[req.Method]++
		r.paths[req.URL.Path]++
		r.mu.Unlock()
		w.WriteHeader(http.StatusUnauthorized)
	}))
	t.Cleanup(srv.Close)
	return r, srv.URL
}

// The flood is of made-up tokens: every request carries a new well-formed
// customer token, so each costs the API a lookup.
func TestGenerateLoadSendsANewTokenEachRequest(t *testing.T) {
	rec, url := newRecorder(t)
	res := floodbench.GenerateLoad(t.Context(), floodbench.LoadSpec{URL: url, Kind: "random-token", Conns: 4, Count: 200})
	if res.Sent != 200 || res.ByStatus["401"] != 200 || res.Errors != 0 || res.Dropped != 0 {
		t.Fatalf("sent %d, by status %v, errors %d, dropped %d; want 200 refused", res.Sent, res.ByStatus, res.Errors, res.Dropped)
	}
	if len(rec.tokens) != 200 {
		t.Fatalf("%d distinct tokens in 200 requests", len(rec.tokens))
	}
	for tok := range rec.tokens {
		if !strings.HasPrefix(tok, "Bearer tly_") {
			t.Fatalf("token %q is not a customer token", tok)
		}
	}
}

// The memory check sends methods never sent before, numbered from First,
// and the CPU-only load touches only /healthz without a token.
func TestGenerateLoadMethodsAndHealthz(t *testing.T) {
	rec, url := newRecorder(t)
	res := floodbench.GenerateLoad(t.Context(), floodbench.LoadSpec{URL: url, Kind: "methods", Conns: 3, Count: 50, First: 1000})
	if res.Sent != 50 || len(rec.methods) != 50 {
		t.Fatalf("sent %d with %d distinct methods, want 50 and 50", res.Sent, len(rec.methods))
	}
	if rec.methods["GET"] != 0 {
		t.Fatal("a methods run sent GET")
	}

	rec, url = newRecorder(t)
	res = floodbench.GenerateLoad(t.Context(), floodbench.LoadSpec{URL: url, Kind: "healthz", Conns: 2, Count: 30})
	if res.Sent != 30 || rec.paths["/healthz"] != 30 || rec.tokens[""] != 30 {
		t.Fatalf("sent %d; paths %v; tokens %d distinct", res.Sent, rec.paths, len(rec.tokens))
	}
}

func TestConfigValidate(t *testing.T) {
	ok := floodbench.Config{Records: 1, PerMessage: 1, Partitions: 1, Rounds: 1, Conns: 1}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []func(*floodbench.Config){
		func(c *floodbench.Config) { c.Records = 0 },
		func(c *floodbench.Config) { c.PerMessage = 10_001 },
		func(c *floodbench.Config) { c.Conns = 0 },
		func(c *floodbench.Config) { c.Methods = -1 },
	} {
		c := ok
		bad(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "bench flood: need") {
			t.Errorf("%+v: %v", c, err)
		}
	}
	if _, err := floodbench.Run(t.Context(), ok); err == nil || !strings.Contains(err.Error(), "URL, AdminToken, Pool, Broker and LoadCommand are required") {
		t.Errorf("Run without a target: %v", err)
	}
}
