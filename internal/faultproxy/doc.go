// Package faultproxy injects faults between Tally and what it depends on,
// for tests: a TCP proxy in front of Postgres or Kafka that passes bytes,
// delays them, swallows them (a blackhole: connections stay open, nothing
// arrives, as when a link or a host silently goes away) or resets every
// connection and refuses new ones (a process or a host that is down), and
// process pause and resume (SIGSTOP/SIGCONT: a stalled VM, a long GC,
// swapping) for tests that run members as subprocesses.
//
// A proxy's mode changes take effect at once on every open connection; a
// Reset closes every connection with a TCP RST, so a client sees "connection
// reset by peer" exactly as when the server dies.
package faultproxy
