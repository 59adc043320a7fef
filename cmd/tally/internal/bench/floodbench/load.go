package floodbench

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// LoadEnv is set to 1 in the load generator's environment, so a program
// standing in for tally (a test binary) knows to run the command it is given.
const LoadEnv = "TALLY_BENCH_LOAD"

// LoadSpec is one run of the load generator, a separate process (like hey
// or wrk, which cannot send a new token on every request).
type LoadSpec struct {
	URL   string  `json:"url"`
	Kind  string  `json:"kind"` // random-token, healthz, methods
	Conns int     `json:"conns"`
	Rate  float64 `json:"rate"` // requests/s, open loop; 0: as fast as answered
	// Duration bounds the run; Count (methods) ends it after that many requests.
	Duration time.Duration `json:"duration"`
	Count    int           `json:"count"`
	First    int64         `json:"first"` // methods: the number of the first method name
}

type LoadResult struct {
	Sent     int64            `json:"sent"`
	Dropped  int64            `json:"dropped"` // due while every connection was busy
	Errors   int64            `json:"errors"`
	ByStatus map[string]int64 `json:"by_status"`
	Seconds  float64          `json:"seconds"`
}

func (r LoadResult) sentPerSecond() float64 { return float64(r.Sent) / r.Seconds }

func (r LoadResult) statuses() string {
	keys := make([]string, 0, len(r.ByStatus))
	for k := range r.ByStatus {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s×%d", k, r.ByStatus[k]))
	}
	if r.Dropped > 0 {
		parts = append(parts, fmt.Sprintf("not sent (all connections busy)×%d", r.Dropped))
	}
	if r.Errors > 0 {
		parts = append(parts, fmt.Sprintf("errors×%d", r.Errors))
	}
	return strings.Join(parts, " ")
}

// runLoad runs the load generator as a child process (command, then the
// spec as JSON) until spec ends or ctx does (then it is interrupted and
// reports what it did).
func runLoad(ctx context.Context, command []string, spec LoadSpec) (LoadResult, error) {
	b, _ := json.Marshal(spec)
	cmd := exec.Command(command[0], append(command[1:len(command):len(command)], string(b))...)
	cmd.Env = append(os.Environ(), LoadEnv+"=1")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return LoadResult{}, err
	}
	if err := cmd.Start(); err != nil {
		return LoadResult{}, err
	}
	stopped := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			_ = cmd.Process.Signal(os.Interrupt)
		case <-stopped:
		}
	}()
	var res LoadResult
	derr := json.NewDecoder(stdout).Decode(&res)
	werr := cmd.Wait()
	close(stopped)
	if derr != nil {
		return res, fmt.Errorf("load generator: %v (exit: %v)", derr, werr)
	}
	return res, nil
}

// GenerateLoad is the load generator's work, in its own process: it sends
// spec's requests on spec.Conns keep-alive connections and reports what
// they were answered.
func GenerateLoad(ctx context.Context, spec LoadSpec) LoadResult {
	if spec.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, spec.Duration)
		defer cancel()
	}
	tr := &http.Transport{MaxIdleConns: spec.Conns, MaxIdleConnsPerHost: spec.Conns, MaxConnsPerHost: spec.Conns, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	var sent, dropped, errs, methodN atomic.Int64
	methodN.Store(spec.First)
	var mu sync.Mutex
	byStatus := map[string]int64{}
	work := make(chan struct{})
	var wg sync.WaitGroup
	do := func() {
		method, path, token := http.MethodGet, "/v1/customers/bench-000/usage", ""
		switch spec.Kind {
		case "healthz":
			path = "/healthz"
		case "random-token":
			var b [32]byte
			_, _ = rand.Read(b[:])
			token = "tly_" + base64.RawURLEncoding.EncodeToString(b[:])
		case "methods":
			method, path = "M"+strconv.FormatInt(methodN.Add(1), 36)+"X", "/v1/customers/bench-000"
		}
		req, err := http.NewRequestWithContext(context.WithoutCancel(ctx), method, spec.URL+path, nil)
		if err != nil {
			errs.Add(1)
			return
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		sent.Add(1)
		res, err := client.Do(req)
		if err != nil {
			errs.Add(1)
			return
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		mu.Lock()
		byStatus[strconv.Itoa(res.StatusCode)]++
		mu.Unlock()
	}
	for range spec.Conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				do()
			}
		}()
	}
	start := time.Now()
	if spec.Rate <= 0 { // closed loop: as fast as answered
	loop:
		for n := 0; spec.Count == 0 || n < spec.Count; n++ {
			select {
			case work <- struct{}{}:
			case <-ctx.Done():
				break loop
			}
		}
	} else { // open loop at spec.Rate; a request due while every connection is busy is dropped
		interval := time.Duration(float64(time.Second) / spec.Rate)
		next := time.Now()
	open:
		for n := 0; spec.Count == 0 || n < spec.Count; n++ {
			next = next.Add(interval)
			if d := time.Until(next); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					break open
				}
			} else if ctx.Err() != nil {
				break
			}
			select {
			case work <- struct{}{}:
			default:
				dropped.Add(1)
			}
		}
	}
	close(work)
	wg.Wait()
	return LoadResult{Sent: sent.Load(), Dropped: dropped.Load(), Errors: errs.Load(), ByStatus: byStatus, Seconds: time.Since(start).Seconds()}
}
