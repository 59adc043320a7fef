// Package notify keeps one Postgres LISTEN connection per process and
// hands every notification on its channel, in commit order, to the
// subscribers registered before Run (the API's usage cache and token
// cache). It owns what they all depend on:
//
//   - The epoch: even while listening, odd while not, changed on every
//     (re)connection and loss. Whatever a subscriber read while the epoch
//     was e is kept coherent by notifications only while the epoch is
//     still e (none was missed since).
//   - Liveness. Postgres keeps every notification until each listening
//     connection has read it: a listener that hangs while connected (a bug
//     in this process, a stopped process) stops the queue from draining,
//     and a full queue fails every commit that notifies, ingest's
//     included. A listener whose connection died silently hears nothing.
//     So a probe is sent on the channel every ProbeEvery. The newest probe
//     the listener has handled says how far it has read: everything
//     committed before that probe was sent. Live reports whether that is
//     within Lease: subscribers trust what they hold only while it is. A
//     listener more than BehindLimit behind has its connection closed, so
//     Postgres forgets it and the queue drains whatever its goroutine is
//     doing; it reconnects once it runs again. Probes are random and
//     remembered until heard, so one forged by another login proves
//     nothing.
//   - The queue. pg_notification_queue_usage() is read with each probe
//     (QueueUsage). The triggers stop notifying once the queue is as full
//     as tally.notify_queue_limit (migration 00012: 0.5 unless set), so
//     that a full queue never fails ingest; from half that limit on the
//     listener is not live, and when the queue is below it again for a
//     Lease and every transaction running when it was first seen below it
//     has ended (one that wrote while the queue was high sent no
//     notifications, and may commit much later), every subscriber forgets
//     everything before it is live again.
//
// A notification is a hint, never data: anyone with a database login can
// NOTIFY a channel. Subscribers forget on it, and read what they need
// from tables.
package notify
