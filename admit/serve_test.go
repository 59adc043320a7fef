package admit_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tally-ledger/tally/internal/ledgertest"
	"github.com/tally-ledger/tally/internal/pgtest"
)

// tallyBinary builds the tally binary from this tree once per test run
// (go build, cached), for tests that need a real tally serve process they
// can freeze (SIGSTOP) like a hung Tally. TestMain removes it.
var (
	buildOnce sync.Once
	buildDir  string
	buildPath string
	buildErr  error
)

func tallyBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "admit-test-tally-")
		if buildErr != nil {
			return
		}
		buildPath = filepath.Join(buildDir, "tally")
		goTool, err := exec.LookPath("go")
		if err != nil {
			buildErr = fmt.Errorf("the go tool builds tally for this test: %w", err)
			return
		}
		cmd := exec.Command(goTool, "build", "-o", buildPath, "github.com/tally-ledger/tally/cmd/tally")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build tally: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildPath
}

func removeTallyBinary() {
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
}

// served is a `tally serve --api` process on a fresh database.
type served struct {
	t   testing.TB
	url string
	cmd *exec.Cmd
}

// startServe starts tally serve --api and returns it with a tally whose
// helpers (rules, tokens, budgets) work on its database.
func startServe(t testing.TB) (*tally, *served) {
	t.Helper()
	dbURL := pgtest.NewURL(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(tallyBinary(t), "serve", "--api", "--no-console", "--api-rate-per-address", "0", "--api-rate-per-token", "0")
	cmd.Env = append(os.Environ(), "TALLY_DATABASE_URL="+dbURL, "TALLY_ADMIN_TOKEN="+adminToken, "TALLY_LISTEN="+addr)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &served{t: t, url: "http://" + addr, cmd: cmd}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get(s.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("tally serve did not start: %v\n%s", err, stderr.String())
		}
	}
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &tally{t: t, pool: pool, url: s.url, cal: ledgertest.SteadyCalendar(time.Now())}, s
}

// freeze stops the process (SIGSTOP): connections are accepted by the
// kernel and never answered, as from a hung Tally. thaw resumes it.
func (s *served) freeze() {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.t.Fatal(err)
	}
}

func (s *served) thaw() {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		s.t.Fatal(err)
	}
}
