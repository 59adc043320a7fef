-- An ingest member's liveness also follows its Postgres session, so that a
-- member whose process is gone loses its partitions at once instead of when
-- its lease runs out. Why: with only the lease, a killed member's partitions
-- stood still for the whole lease (2 s) plus a balancing round before
-- anyone could claim them, and a crash loop chained those waits. A member now
-- holds one connection for its life and records that backend's pid here;
-- when the process dies the kernel closes the connection, the backend exits
-- and the member stops being live, while the lease still bounds a member
-- that is stopped or cut off without its connection closing (a paused
-- process, a dead host, a blackholed link) (docs/design.md §9).
--  * session_pid NULL (a member of an older build) means the lease alone
--    decides, as before.
--  * A pid reused by another backend only makes a dead member look live
--    until its lease runs out: the slow path, never a wrong claim.

-- +goose Up
ALTER TABLE ingest_members ADD COLUMN session_pid int;

-- +goose Down
ALTER TABLE ingest_members DROP COLUMN session_pid;
