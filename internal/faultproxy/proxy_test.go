package faultproxy_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tally-ledger/tally/internal/faultproxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo serves lines back until the test ends.
func echo(t *testing.T) string {
	t.Helper()
	return echoOn(t, "tcp", "127.0.0.1:0")
}

func echoOn(t *testing.T, network, addr string) string {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

func roundTrip(c net.Conn, msg string, wait time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(wait))
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// A proxy forwards to a Unix socket named unix:/path (a private Postgres
// listening on no TCP port), and resets it like any target.
func TestProxyToAUnixSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "echo.sock")
	echoOn(t, "unix", sock)
	p, err := faultproxy.Start("unix:" + sock)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, "hello", 5*time.Second); err != nil || got != "hello" {
		t.Fatalf("through the proxy to %s: %q, %v", sock, got, err)
	}
	p.Reset()
	if _, err := roundTrip(c, "again", 2*time.Second); err == nil {
		t.Fatal("a reset connection still answered")
	}
}

func TestProxyModes(t *testing.T) {
	p, err := faultproxy.Start(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, "one", 5*time.Second); err != nil || got != "one" {
		t.Fatalf("pass: %q, %v", got, err)
	}

	p.Latency(300 * time.Millisecond)
	t0 := time.Now()
	if got, err := roundTrip(c, "two", 5*time.Second); err != nil || got != "two" {
		t.Fatalf("latency: %q, %v", got, err)
	}
	if took := time.Since(t0); took < 600*time.Millisecond {
		t.Errorf("a round trip with 300ms each way took %v", took)
	}
	p.Latency(0)

	p.Blackhole()
	if got, err := roundTrip(c, "three", 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("blackhole: %q, %v; want a timeout", got, err)
	}
	p.Pass() // the held bytes arrive now
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "three\n" {
		t.Fatalf("after the blackhole: %q, %v", line, err)
	}

	p.Reset()
	if _, err := roundTrip(c, "four", 5*time.Second); !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
		t.Fatalf("reset: %v; want the connection reset", err)
	}
	// New connections are refused until Pass.
	if c2, err := net.Dial("tcp", p.Addr()); err == nil {
		_, rerr := roundTrip(c2, "five", 5*time.Second)
		c2.Close()
		if rerr == nil {
			t.Fatal("a new connection passed while the proxy refuses")
		}
	}
	p.Pass()
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if got, err := roundTrip(c3, "six", 5*time.Second); err != nil || got != "six" {
		t.Fatalf("pass again: %q, %v", got, err)
	}
}

func TestPauseAndResume(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	state := func() string {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b)) // pid (comm) state ...
		return f[2]
	}
	if err := faultproxy.Pause(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	waitState(t, state, "T")
	if err := faultproxy.Resume(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	waitState(t, state, "S")
}

func waitState(t *testing.T, state func() string, want string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if state() == want {
			return
		}
	}
	t.Fatalf("process state %s, want %s", state(), want)
}

// Latency delays each chunk from when it was read, as a long link does:
// a megabyte through 50 ms each way takes about one round trip, not one
// latency per chunk the proxy reads.
func TestLatencyIsADelayNotABandwidthCap(t *testing.T) {
	p, err := faultproxy.Start(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Latency(50 * time.Millisecond)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	sent := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	t0 := time.Now()
	go func() { _, _ = c.Write(sent) }()
	got := make([]byte, len(sent))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	if !bytes.Equal(got, sent) {
		t.Fatal("the echo differs from what was sent")
	}
	if took < 100*time.Millisecond || took > time.Second {
		t.Errorf("1 MiB through 50 ms each way took %v; want about one round trip (100 ms)", took)
	}
}
