package ingest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"syscall"
	"time"
)

// NotReady says what this member is not ready for, one sentence each, from
// its own state (it asks nothing of Postgres or Kafka, so a probe is cheap
// and a flood of them costs nothing): not running, its lease in Postgres not
// renewed (the database is down or unreachable), no balancing round done
// yet (it has not claimed its partitions), the topic's partitions unknown
// (Kafka unreachable), partitions stalled. Nil means ready.
func (c *Consumer) NotReady() []string {
	a := c.assign
	cfg := c.cfg
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	if c.runCtx == nil || c.runCtx.Err() != nil {
		return []string{"ingest is not running"}
	}
	switch {
	case a.member == "" && a.renewErr != nil:
		out = append(out, "ingest cannot register in Postgres (the database is down or unreachable?)"+because(a.renewErr))
	case a.member == "":
		out = append(out, "ingest is starting: not registered as a member yet")
	case a.renewErr != nil && time.Since(a.renewedAt) > 2*cfg.HeartbeatInterval:
		out = append(out, fmt.Sprintf("ingest cannot renew its lease in Postgres since %s (the database is down or unreachable?)%s",
			a.renewedAt.UTC().Format(time.RFC3339), because(a.renewErr)))
	}
	if a.member != "" && !a.balanced {
		switch {
		case a.partitions == 0 && a.balanceErr != nil:
			out = append(out, "ingest holds no partition leases yet: the topic's partitions are not known"+because(a.balanceErr))
		case a.partitions == 0:
			out = append(out, "ingest holds no partition leases yet: the topic's partitions are not known (is Kafka reachable?)")
		default:
			out = append(out, "ingest holds no partition leases yet: it has not finished claiming its share")
		}
	}
	if len(a.stalled) > 0 {
		ids := make([]int, 0, len(a.stalled))
		for id := range a.stalled {
			ids = append(ids, id)
		}
		sort.Ints(ids)
		parts := make([]string, len(ids))
		for i, id := range ids {
			parts[i] = fmt.Sprintf("%d (retrying since %s)", id, a.stalled[id].UTC().Format(time.RFC3339))
		}
		out = append(out, fmt.Sprintf("ingest stalled on partition %s of %s: its usage is not being applied; see the ingest log",
			strings.Join(parts, ", "), cfg.Topic))
	}
	return out
}

// setStalled records that partition id has been stalled since since (zero:
// it resumed).
func (a *assigner) setStalled(id int, since time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if since.IsZero() {
		delete(a.stalled, id)
		return
	}
	if _, ok := a.running[id]; ok {
		a.stalled[id] = since
	}
}

// because is why err happened, in words that name nothing of the
// deployment (anyone may read /readyz; the log has the error, with its
// addresses, roles and names): ": the connection was refused", ": timed
// out", ": a name does not resolve", else that the log says.
func because(err error) string {
	var dns *net.DNSError
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return ": the connection was refused (see the ingest log)"
	case errors.As(err, &dns):
		return ": a name does not resolve (see the ingest log)"
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return ": timed out (see the ingest log)"
	}
	return " (see the ingest log)"
}
