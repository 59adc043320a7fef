package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// CPU time, which the machine's load changes far less than wall-clock
// time: this process's (Tally, and the embedded broker it serves itself
// from), and that of the Postgres backends a measurement used, read from
// /proc when Postgres runs on this host (otherwise not shown).

const (
	benchIngestApp = "tally-bench-ingest"

	qBackendsOf = `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`
	qBackendPID = `SELECT pg_backend_pid()`
)

// clkTck is the kernel's clock tick of /proc/<pid>/stat's times (USER_HZ,
// 100 on every Linux architecture Tally runs on).
const clkTck = 100

// processCPU is this process's user and system CPU so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// backendCPU is the CPU a Postgres backend has used, if this host runs it.
func backendCPU(pid int32) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/stat")
	if err != nil {
		return 0, false
	}
	// Fields after the command (which may hold spaces) in parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, false
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(ut+st) * time.Second / clkTck, true
}

// backendsCPU sums the CPU of the current database's backends named app.
func backendsCPU(ctx context.Context, conn interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, app string) (time.Duration, int, bool) {
	rows, err := conn.Query(ctx, qBackendsOf, app)
	if err != nil {
		return 0, 0, false
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil || len(pids) == 0 {
		return 0, 0, false
	}
	var sum time.Duration
	for _, pid := range pids {
		d, ok := backendCPU(pid)
		if !ok {
			return 0, 0, false
		}
		sum += d
	}
	return sum, len(pids), true
}

// cpuPerRecord collects, by measurement label, the CPU each run spent per
// record, Postgres's and this process's together.
type cpuPerRecord map[string][]float64

// printCPU prints what a measurement of n records cost in CPU, and adds it
// to seen when Postgres's backends could be read.
func printCPU(out io.Writer, label string, n int, process time.Duration, backends time.Duration, nb int, ok bool, seen cpuPerRecord) {
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(n) }
	if ok {
		fmt.Fprintf(out, "    CPU of %s: Postgres %.1f µs per record (%d backends), this process %.1f µs per record\n",
			label, per(backends), nb, per(process))
		seen[label] = append(seen[label], per(backends)+per(process))
		return
	}
	fmt.Fprintf(out, "    CPU of %s: this process %.1f µs per record (Postgres's backends are not on this host)\n", label, per(process))
}

// startCPUProfile writes a CPU profile of this process to path until stop
// is called (nothing when path is empty): the --cpuprofile of the benches.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
