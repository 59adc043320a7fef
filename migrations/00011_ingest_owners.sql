-- Which consumer-group member holds each ingest partition, since when, and
-- until when its lease runs. Why: when a member crashes, its partitions must
-- be visibly unowned (GET /v1/ingest/status, /readyz) instead of looking
-- merely quiet, and a member whose partition another member has claimed must
-- learn it from Postgres and stop at once (stop reading, roll back), without
-- waiting for its Kafka heartbeat to fail.
--  * A member claims a partition when the group assigns it and renews the
--    lease (lease_until = now() + its session timeout) every heartbeat
--    interval, in a table of its own so that renewing never waits for the
--    row lock a micro-batch transaction holds on ingest_partitions.
--  * Leases are per consumer group (generations only compare within one
--    group). A claim overwrites an older generation's, a released or an
--    expired claim, and waits otherwise; a renewal matches only the member's
--    own claim, so a member that was claimed over sees its renewal miss.
--  * On a clean shutdown the member releases (member NULL, lease_until =
--    now()); a crashed member's lease simply runs out. Either way the
--    partition is unowned from lease_until on until the next claim.
--  * Time is the database's clock (now()) for every member and reader.

-- +goose Up
CREATE TABLE ingest_partition_owners (
    topic          text        NOT NULL,
    partition      integer     NOT NULL CHECK (partition >= 0),
    consumer_group text        NOT NULL,
    -- The Kafka consumer-group member id; NULL once released.
    member       text,
    generation   integer     NOT NULL,
    -- host:pid of the member's process, for operators.
    process      text        NOT NULL DEFAULT '',
    -- When this member claimed the partition (kept across generations while
    -- the same member keeps it), or when it released it.
    since        timestamptz NOT NULL,
    lease_until  timestamptz NOT NULL,
    PRIMARY KEY (topic, partition, consumer_group)
);

-- +goose Down
DROP TABLE ingest_partition_owners;
