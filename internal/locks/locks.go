// Package locks declares every Postgres advisory-lock key space Tally
// takes, in one place, so that no two subsystems share one by accident.
// Each names who takes it, how, and why.
//
// Tally's locks are two-key (pg_advisory*_lock(int, int)): the first key
// is one of the spaces below, the second a hash within it. Single-key
// (bigint) locks are a separate key space in Postgres; Tally takes one,
// in its tests. Advisory locks are per database.
package locks

// Two-key spaces.
const (
	// Customer orders applying usage against closing a period: ledger's
	// Apply takes it shared, in its transaction, for every customer of a
	// micro-batch; periods.Store.Close takes it exclusively for one
	// customer, so no usage lands in a period while it is being closed.
	// The second key is abs(hashtext(customer) % CustomerBuckets), so a
	// micro-batch takes a bounded number of locks.
	Customer = 71540
	// CustomerBuckets is how many second keys Customer has.
	CustomerBuckets = 256

	// ReconcileRun lets one reconciliation run at a time check a period:
	// reconcile takes it with pg_try_advisory_lock, for every period name
	// the run covers, on a connection the run holds (a session lock: a run
	// spans many transactions); a second run wanting a held period fails
	// with reconcile.ErrBusy rather than wait. The second key is
	// hashtext of the period's name ("2026-11-01").
	ReconcileRun = 71541

	// QuotaRule serialises new versions of one quota rule (quota's
	// PutRule, in its transaction): the next version number and the
	// effective-time check read the previous version under it. The second
	// key is hashtext("customer/meter").
	QuotaRule = 71542

	// PoolMembership orders a customer's first grant of a period against
	// the customer joining a pool. Issuing takes it shared for every
	// customer whose budget row it creates, before creating it; a join
	// (admission.Store.PutPool) takes it exclusively for every joining
	// customer before it brings their consumption into the pool. A new
	// budget row is invisible to the join until it commits, so without it
	// a grant could commit without the pool while the join missed it. The
	// second key is hashtext(customer).
	PoolMembership = 71543

	// ExactScope orders bringing a pool or global budget to a rule version
	// (its first grant of a period, or a rule that turned exact again)
	// against grants in flight that did not draw from it: every issue
	// batch of admission takes it shared for each meter it issues, first
	// of all its locks; a batch that brings a pool or global budget takes
	// it exclusively for that meter instead, so every grant decided before
	// has committed and is counted. The second key is hashtext(meter).
	ExactScope = 71544

	// MeterKinds orders declaring a meter's kind against usage of it:
	// ledger's Apply takes it shared, in its transaction, before it reads
	// the kinds of a micro-batch's meters; ledger.DeclareMeter takes it
	// exclusively before it checks that a meter whose kind changes has no
	// streams, so a kind never changes under usage. The second key is 0.
	MeterKinds = 71545

	// GaugeLevel serialises the writers of one customer's gauge: ledger's
	// gauge path reads a gauge's buckets, recomputes and writes them back,
	// in its transaction, holding this exclusively for every (customer,
	// meter) of its micro-batch, sorted. The second key is
	// hashtext(customer || '/' || meter).
	GaugeLevel = 71546

	// UniqueMembers serialises the writers of one customer's unique
	// meter: ledger's unique path looks the batch's members up in the
	// readings, counts the new ones and writes the readings, in its
	// transaction, holding this exclusively for every (customer, meter)
	// of its micro-batch, sorted. The second key is
	// hashtext(customer || '/' || meter).
	UniqueMembers = 71547
	// ReconcileRunAlive marks a reconciliation run as still running:
	// reconcile takes it with pg_advisory_lock on the connection holding
	// the run's ReconcileRun locks before it stores the run as running,
	// and releases it when the run ends; a run stored as running whose
	// lock nobody holds was left by a process that died (pg_locks tells),
	// and the next run stores it as failed. The second key is
	// hashtext of the run's id.
	ReconcileRunAlive = 71548

	// AlertRule serialises new versions of one alert rule (alerts'
	// PutRule and DeleteRule, in their transactions): the next version
	// number is read under it. The second key is hashtext(name).
	AlertRule = 71549
)

// Single-key spaces.
const (
	// TestTemplate serialises building the test template database of one
	// schema fingerprint (internal/pgtest), on the maintenance database,
	// across test processes.
	TestTemplate = 7154321
)
