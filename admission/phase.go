package admission

import "time"

// Where a request's time goes (tally_admission_phase_seconds). Under
// load, a grant request that a counter would answer in one statement
// waits in turn for a plan, for an issue transaction to take it, for a
// connection and for the transaction itself; each wait is observed
// apart, so an operator (and tally bench admission) can tell a queue in
// Tally from a slow Postgres.
const (
	phasePlan       = "plan"
	phaseQueue      = "queue"
	phaseConnection = "connection"
	phasePostgres   = "postgres"
)

var phaseNames = []string{phasePlan, phaseQueue, phaseConnection, phasePostgres}

// The path labels: a grant request, or a debit.
const (
	pathGrant = "grant"
	pathDebit = "debit"
)

// pathOf is the path label of req.
func pathOf(req IssueRequest) string {
	if req.debit {
		return pathDebit
	}
	return pathGrant
}

// observe records d as phase of path.
func (m *issueMetrics) observe(path, phase string, d time.Duration) {
	m.phases.WithLabelValues(path, phase).Observe(d.Seconds())
}

// observeBatch records, for every request of a batch that ran from start
// (before its connection was acquired) to end, with the connection at
// acquired: how long it queued (since it joined the combiner, for those
// that did), waited for the connection and spent in the transaction.
func (m *issueMetrics) observeBatch(batch []*call, start, acquired, end time.Time) {
	for _, c := range batch {
		path := pathOf(c.req)
		if !c.queued.IsZero() {
			m.observe(path, phaseQueue, start.Sub(c.queued))
		}
		m.observe(path, phaseConnection, acquired.Sub(start))
		m.observe(path, phasePostgres, end.Sub(acquired))
	}
}
