package chaosbench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/tally-ledger/tally/internal/faultproxy"
)

// A member that runs as a real subprocess (Config.Process: `tally serve
// --ingest`), so that the schedule can stop it with SIGSTOP past its lease
// and continue it with SIGCONT, as a stalled host or a long GC pause would,
// and probe its /readyz. Its Postgres and Kafka links go through proxies of
// its own like every member's.

// ProcessSpec is what Config.Process starts a process with: an ingest
// member, or with API the API process the gateways call.
type ProcessSpec struct {
	API         bool   // tally serve --api (Broker and Topic unused)
	DatabaseURL string // through the process's Postgres proxy
	Broker      string // the process's Kafka proxy
	Topic       string
	Listen      string // host:port for /readyz
	// HeartbeatInterval and SessionTimeout are the run's lease timings.
	HeartbeatInterval, SessionTimeout time.Duration
}

// ServeArgs are the arguments of `tally serve --ingest` (or `--api`) for
// spec.
func ServeArgs(spec ProcessSpec) []string {
	if spec.API {
		return []string{"serve", "--api", "--no-console", "--listen", spec.Listen, "--database-url", spec.DatabaseURL}
	}
	return []string{"serve", "--ingest", "--listen", spec.Listen, "--database-url", spec.DatabaseURL,
		"--kafka-brokers", spec.Broker, "--topic", spec.Topic,
		"--session-timeout", spec.SessionTimeout.String(), "--heartbeat-interval", spec.HeartbeatInterval.String()}
}

type process struct {
	spec ProcessSpec
	cmd  *exec.Cmd
	done chan struct{}
}

// startProcess starts the member process of m.
func (r *run) startProcess(m *member) error {
	p, err := r.spawn(ProcessSpec{DatabaseURL: proxiedURL(r.cfg.DatabaseURL, m.pg.Addr()), Broker: m.kafka.Addr(), Topic: r.cfg.Topic,
		HeartbeatInterval: r.cfg.HeartbeatInterval, SessionTimeout: r.cfg.SessionTimeout}, "")
	if err != nil {
		return err
	}
	m.proc = p
	return nil
}

// spawn starts a process of spec on a free port (with adminToken, when
// set, as TALLY_ADMIN_TOKEN).
func (r *run) spawn(spec ProcessSpec, adminToken string) (*process, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	spec.Listen = ln.Addr().String()
	_ = ln.Close() // the process binds it next
	cmd := r.cfg.Process(spec)
	if adminToken != "" {
		if cmd.Env == nil {
			cmd.Env = os.Environ()
		}
		cmd.Env = append(cmd.Env, "TALLY_ADMIN_TOKEN="+adminToken)
	}
	if cmd.Stdout == nil {
		cmd.Stdout = r.cfg.ProcessLog
	}
	if cmd.Stderr == nil {
		cmd.Stderr = r.cfg.ProcessLog
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start process (%s): %w", strings.Join(ServeArgs(spec)[:2], " "), err)
	}
	p := &process{spec: spec, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// waitProcessReady waits until the member process answers /readyz with
// 200, so that no fault hits its start (a process that cannot read the
// schema when it starts exits, for its supervisor to start it again).
func (r *run) waitProcessReady(ctx context.Context, m *member, timeout time.Duration) error {
	return waitReady(ctx, m.proc, timeout)
}

func waitReady(ctx context.Context, p *process, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		nr := p.notReady(ctx)
		if nr == "" {
			return nil
		}
		if time.Now().After(deadline) || strings.Contains(nr, "exited") {
			return fmt.Errorf("process (%s) not ready %s after its start: %s", strings.Join(ServeArgs(p.spec)[:2], " "), timeout, nr)
		}
		sleep(ctx, 100*time.Millisecond)
	}
}

// stopProcess ends the member process cleanly (SIGCONT first, in case it is
// stopped; then SIGTERM).
func (r *run) stopProcess(m *member) error {
	p := m.proc
	if p == nil {
		return nil
	}
	m.proc = nil
	return p.stop()
}

func (p *process) stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("member process %d did not stop within 30s of SIGTERM", p.cmd.Process.Pid)
	}
}

// pauseProcess stops the member process for d (SIGSTOP), then continues it.
func pauseProcess(ctx context.Context, m *member, d time.Duration) error {
	pid := m.proc.cmd.Process.Pid
	if err := faultproxy.Pause(pid); err != nil {
		return err
	}
	sleep(ctx, d)
	return faultproxy.Resume(pid)
}

// notReady is what the member process's /readyz says it is not ready for
// ("" when it answers 200).
func (p *process) notReady(ctx context.Context) string {
	select {
	case <-p.done:
		return "member process exited"
	default:
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.spec.Listen+"/readyz", nil)
	if err != nil {
		return err.Error()
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return "/readyz: " + err.Error()
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		var b strings.Builder
		buf := make([]byte, 512)
		n, _ := res.Body.Read(buf)
		b.Write(buf[:n])
		return fmt.Sprintf("/readyz answered %d: %s", res.StatusCode, strings.TrimSpace(b.String()))
	}
	return ""
}

// proxiedURL is databaseURL reached through the proxy at addr.
func proxiedURL(databaseURL, addr string) string {
	u, _ := url.Parse(databaseURL)
	u.Host = addr
	q := u.Query()
	q.Del("host") // a Unix socket's directory: the proxy forwards there
	q.Del("port")
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	return u.String()
}
