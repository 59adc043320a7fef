package cli

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"time"
)

// CPU time, which the machine's load changes far less than wall-clock
// time: this process's (Tally, and the embedded broker it serves itself
// from), and that of the Postgres backends a measurement used, read from
// /proc when Postgres runs on this host (otherwise not shown).

const (
	benchIngestApp = "tally-bench-ingest"

	qBackendPID = `SELECT pg_backend_pid()`
)

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
