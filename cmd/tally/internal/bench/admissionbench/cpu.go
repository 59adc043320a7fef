package admissionbench

import (
	"bytes"
	"os"
	"strconv"
	"time"
)

// machineCPU is the CPU time this host's cores have spent busy (not idle,
// not waiting for I/O) since boot, and their count, from /proc/stat; ok
// false where there is none. A regime's replay on this host runs the
// gateways, the API and Postgres alike: the busy time over the replay is
// what the regime costs the machine, which the load around it moves far
// less than latency.
func machineCPU() (busy time.Duration, cores int, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, rest, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 6 || string(f[0]) != "cpu" {
		return 0, 0, false
	}
	var ticks int64
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return 0, 0, false
		}
		if i != 3 && i != 4 && i < 8 { // idle and iowait are not busy; guest time is in user's already
			ticks += n
		}
	}
	for l := range bytes.SplitSeq(rest, []byte("\n")) {
		if len(l) > 3 && bytes.HasPrefix(l, []byte("cpu")) && l[3] >= '0' && l[3] <= '9' {
			cores++
		}
	}
	const clkTck = 100 // USER_HZ on every Linux architecture
	return time.Duration(ticks) * time.Second / clkTck, cores, true
}
