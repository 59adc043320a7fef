-- The Kafka consumer's state (docs/design.md §3 "Exactly-once effect", "Conservation",
-- §9). Why it lives here and looks like this:
--  * The next offset of each (topic, partition) is stored in Postgres and
--    written in the same transaction as the ledger rows it covers, with a
--    compare-and-set on next_offset that fences a member that lost the
--    partition. Offsets committed to Kafka are for dashboards only.
--  * Conservation counters live on the same row, updated in the same
--    transaction, so "records in = sum of outcomes" holds at every commit
--    and reconciliation can check it per partition.
--  * Dead letters keep the exact bytes of what was refused (key and value, or
--    the one record's JSON) with partition and offset, so nothing is lost and
--    a message can be replayed after a fix.
--  * Offset jumps (retention deleted unread messages) are rows, never a
--    silent skip.

-- +goose Up
CREATE TABLE ingest_partitions (
    topic              text        NOT NULL,
    partition          integer     NOT NULL CHECK (partition >= 0),
    -- The offset of the next message to consume; everything below it has
    -- been applied (or dead-lettered) and counted.
    next_offset        bigint      NOT NULL CHECK (next_offset >= 0),
    -- The partition's high watermark as last seen by the consumer.
    high_watermark     bigint      NOT NULL DEFAULT 0,
    -- Usage is complete through this instant: the Kafka timestamp of the
    -- last consumed message, or the time the consumer last found the
    -- partition caught up (next_offset = high_watermark).
    applied_through    timestamptz,
    messages_in        bigint      NOT NULL DEFAULT 0,
    messages_rejected  bigint      NOT NULL DEFAULT 0,
    records_in         bigint      NOT NULL DEFAULT 0,
    records_applied    bigint      NOT NULL DEFAULT 0,
    records_duplicate  bigint      NOT NULL DEFAULT 0,
    records_conflict   bigint      NOT NULL DEFAULT 0,
    records_late_fill  bigint      NOT NULL DEFAULT 0,
    records_rejected   bigint      NOT NULL DEFAULT 0,
    -- The consumer-group member and generation that wrote last (diagnostics).
    owner              text,
    generation         integer,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition),
    -- Conservation: every record that came in has exactly one outcome.
    CONSTRAINT ingest_partitions_conservation CHECK (
        records_in = records_applied + records_duplicate + records_conflict
                   + records_late_fill + records_rejected)
);

-- Messages and records that were refused, with their exact bytes.
CREATE TABLE dead_letters (
    id            uuid        PRIMARY KEY,  -- UUIDv7: sorts by arrival
    topic         text        NOT NULL,
    partition     integer     NOT NULL,
    "offset"      bigint      NOT NULL,
    record_index  integer,                  -- NULL: the whole message was refused
    reason        text        NOT NULL,     -- a wire reason or a ledger reason
    field         text,                     -- JSON path of the offending value, when known
    detail        text        NOT NULL,
    key           bytea,
    raw           bytea       NOT NULL,     -- the message value, or the record's JSON
    producer      text,                     -- a refused record's message header, to replay it alone
    epoch         bigint,
    created_at    timestamptz NOT NULL,
    replayed_at   timestamptz,
    replay_outcome text
    -- No unique key on (topic, partition, offset, record_index): dead
    -- letters commit with the offset that consumes them, so a retried or
    -- fenced batch never writes one twice, and a recreated topic (offsets
    -- starting again at 0) must not lose its dead letters to a conflict.
);
CREATE INDEX dead_letters_position ON dead_letters (topic, partition, "offset");
CREATE INDEX dead_letters_pending ON dead_letters (created_at) WHERE replayed_at IS NULL;

-- Offsets the consumer expected but Kafka no longer had (retention deleted
-- unread messages, or the topic was recreated). Reported, never skipped
-- silently.
CREATE TABLE ingest_offset_jumps (
    id           uuid        PRIMARY KEY,
    topic        text        NOT NULL,
    partition    integer     NOT NULL,
    from_offset  bigint      NOT NULL,  -- the offset the consumer expected
    to_offset    bigint      NOT NULL CHECK (to_offset > from_offset),  -- the offset it got
    detected_at  timestamptz NOT NULL,
    detail       text        NOT NULL
);
CREATE INDEX ingest_offset_jumps_position ON ingest_offset_jumps (topic, partition, from_offset);

-- Which partition each customer's usage arrives on (the message key is the
-- customer id). Quota decisions and usage queries take "usage is complete
-- through" from that partition's applied_through, not from the whole topic.
CREATE TABLE ingest_customers (
    customer   text    NOT NULL,
    topic      text    NOT NULL,
    partition  integer NOT NULL,
    first_seen timestamptz NOT NULL,
    PRIMARY KEY (customer, topic)
);

-- +goose Down
DROP TABLE ingest_customers, ingest_offset_jumps, dead_letters, ingest_partitions;
