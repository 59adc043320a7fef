package admissionbench

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// httpCounter is the central Postgres counter behind a service of its
// own, as gateways that hold no database credentials would reach it: each
// request is an HTTP call (a bearer token, a JSON body) to a handler that
// runs the counter's one statement on a pool the size of Tally's API's.
// Beside the plain counter it splits the exact path's cost: what the hop
// costs, and what Tally does beyond it.
type httpCounter struct {
	counter *pgCounter // its table, and its check at the end
	pool    *pgxpool.Pool
	srv     *http.Server
	served  chan error
	url     string
	token   string
	clients []*http.Client
	n       atomic.Int64
}

// takeRequest and takeAnswer are the counter service's wire format.
type takeRequest struct {
	Customer int   `json:"customer"`
	Cost     int64 `json:"cost"`
}

type takeAnswer struct {
	Admitted bool `json:"admitted"`
}

func startHTTPCounter(ctx context.Context, o Options) (_ system, err error) {
	s, err := startPostgresCounter(ctx, o)
	if err != nil {
		return nil, err
	}
	h := &httpCounter{counter: s.(*pgCounter), token: runID() + runID() + runID() + runID()}
	defer func() {
		if err != nil {
			_, _, _ = h.end(context.WithoutCancel(ctx), nil)
		}
	}()
	if h.pool, err = newPool(ctx, o.DatabaseURL, o.APIPoolSize); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /take", h.take)
	h.url = "http://" + ln.Addr().String() + "/take"
	h.srv, h.served = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, make(chan error, 1)
	go func() { h.served <- h.srv.Serve(ln) }()
	for range o.Gateways {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 16 // as the exact regimes' gateways
		h.clients = append(h.clients, &http.Client{Timeout: 5 * time.Second, Transport: tr})
	}
	return h, nil
}

// take is the service's handler: the token, then the counter's statement.
func (h *httpCounter) take(w http.ResponseWriter, r *http.Request) {
	if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+h.token)) != 1 {
		http.Error(w, "unknown token", http.StatusUnauthorized)
		return
	}
	var req takeRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<10)).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var used int64
	err := h.pool.QueryRow(r.Context(), qCounterTake, pgx.NamedArgs{"customer": req.Customer, "cost": req.Cost}).Scan(&used)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(takeAnswer{Admitted: err == nil})
}

func (h *httpCounter) admit(ctx context.Context, gw int, c int, cost int64) (bool, error) {
	h.n.Add(1)
	body, err := json.Marshal(takeRequest{Customer: c, Cost: cost})
	if err != nil {
		return false, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Authorization", "Bearer "+h.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.clients[gw].Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		return false, fmt.Errorf("counter service: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	var ans takeAnswer
	if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil {
		return false, fmt.Errorf("counter service: %w", err)
	}
	return ans.Admitted, nil
}

func (h *httpCounter) calls() (int64, int64) { n := h.n.Load(); return n, n }

func (h *httpCounter) end(ctx context.Context, admitted []int64) (int64, []string, error) {
	if h.srv != nil {
		_ = h.srv.Shutdown(ctx)
		<-h.served
	}
	for _, c := range h.clients {
		c.CloseIdleConnections()
	}
	if h.pool != nil {
		h.pool.Close()
	}
	return h.counter.end(ctx, admitted) // closes the counter's pool (nil admitted: a failed start, nothing checked)
}
