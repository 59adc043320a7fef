// Package pgcpu reads the CPU time Postgres backends have used, from
// /proc, when Postgres runs on this host, and this process's own: what a
// benchmark costs each side, which the machine's load changes far less
// than wall-clock time.
package pgcpu

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// clkTck is the kernel's clock tick of /proc/<pid>/stat's times (USER_HZ,
// 100 on every Linux architecture Tally runs on).
const clkTck = 100

// Process is this process's user and system CPU so far (0 where it
// cannot be read).
func Process() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Backend is the CPU the Postgres backend pid has used, if this host runs
// it.
func Backend(pid int32) (time.Duration, bool) {
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

// Querier is what Database reads the backends with: a pool or a
// connection.
type Querier interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}

const qBackends = `SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend' AND ($1 = '' OR application_name = $1)`

// Database sums the CPU of the current database's client backends (those
// whose application_name is app, unless app is empty), and counts them;
// ok is false when one of them cannot be read (Postgres on another host).
func Database(ctx context.Context, q Querier, app string) (sum time.Duration, backends int, ok bool) {
	rows, err := q.Query(ctx, qBackends, app)
	if err != nil {
		return 0, 0, false
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil || len(pids) == 0 {
		return 0, 0, false
	}
	for _, pid := range pids {
		d, ok := Backend(pid)
		if !ok {
			return 0, 0, false
		}
		sum += d
	}
	return sum, len(pids), true
}
