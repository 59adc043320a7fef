-- Ingest members and their leases, so that Postgres, not the Kafka group
-- coordinator, decides which member consumes which partition. Why: with a
-- Kafka consumer group every join and every death was a stop-the-world
-- rebalance of all partitions (kafka-go has no cooperative rebalancing), and
-- a misbehaving coordinator could leave partitions unowned for minutes. Tally
-- already fences each partition's offset in Postgres; the assignment now
-- lives beside it (docs/design.md §9):
--  * ingest_members: one row per running member (a random id per process
--    start, or per eviction), renewed every heartbeat interval
--    (lease_until = now() + the lease). A member is live while lease_until
--    is in the future; a member whose renewal finds its lease ran out is
--    evicted and registers again under a new id. Members count the live
--    rows to compute their fair share of the partitions.
--  * ingest_partition_owners (00011) keeps one row per partition: the
--    member that holds it and `generation`, now the lease's fencing epoch,
--    incremented by every claim. A claim succeeds only on a partition
--    released (member NULL) or whose member is not live. Every write of a
--    micro-batch checks (member, epoch) and the member's liveness in the
--    same transaction and keeps the owners row share-locked until it
--    commits, so a claim waits for it and a member whose partition was
--    claimed commits nothing. The owners row's lease_until is now the time
--    of the claim or the release; liveness is the member's row.

-- +goose Up
CREATE TABLE ingest_members (
    topic          text        NOT NULL,
    consumer_group text        NOT NULL,
    member         text        NOT NULL,
    -- host:pid of the member's process, for operators.
    process        text        NOT NULL,
    started_at     timestamptz NOT NULL DEFAULT now(),
    lease_until    timestamptz NOT NULL,
    PRIMARY KEY (topic, consumer_group, member)
);

-- +goose Down
DROP TABLE ingest_members;
