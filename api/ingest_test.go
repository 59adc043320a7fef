package api_test

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/api"
	"github.com/tally-ledger/tally/ingest/wire"
)

func TestIngestStatus(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// The notification queue is the whole Postgres server's: any value
	// from 0 to 1 (another database's listener may lag).
	if r := f.do("GET", "/v1/ingest/status", adminToken, nil); !regexp.MustCompile(`^\{"topic":"tally.meter-batches","partitions":\[\],"notification_queue_usage":[0-9.e+-]+\}\n$`).Match(r.body) {
		t.Fatalf("no partitions: %s", r.body)
	}
	f.exec(`INSERT INTO ingest_partitions (topic, partition, next_offset, high_watermark, applied_through, messages_in, records_in, records_applied, records_duplicate, owner, generation, updated_at) VALUES
		('tally.meter-batches', 0, 90, 100, '2026-11-20T11:59:58Z', 90, 300, 299, 1, 'tally-1', 3, '2026-11-20T11:59:59Z'),
		('tally.meter-batches', 1, 10, 10, NULL, 0, 0, 0, 0, NULL, NULL, '2026-11-20T11:59:59Z'),
		('other.topic', 0, 5, 5, NULL, 0, 0, 0, 0, NULL, NULL, '2026-11-20T11:59:59Z')`)
	// Partition 0 is held by a live member; partition 1's owner crashed
	// (its lease ran out).
	f.exec(`INSERT INTO ingest_partition_owners (topic, partition, consumer_group, member, generation, process, since, lease_until) VALUES
		('tally.meter-batches', 0, 'tally-ingest', 'tally-1', 3, 'host-a:41', '2026-11-20T11:00:00Z', now() + interval '1 hour'),
		('tally.meter-batches', 1, 'tally-ingest', 'tally-2', 3, 'host-b:42', '2026-11-20T10:00:00Z', '2026-11-20T11:59:30Z')`)
	f.exec(`INSERT INTO ingest_members (topic, consumer_group, member, process, lease_until) VALUES
		('tally.meter-batches', 'tally-ingest', 'tally-1', 'host-a:41', now() + interval '1 hour'),
		('tally.meter-batches', 'tally-ingest', 'tally-2', 'host-b:42', '2026-11-20T11:59:30Z')`)
	var st struct {
		Topic      string
		Partitions []struct {
			Partition, NextOffset, Lag int
			AppliedThrough             *string `json:"applied_through"`
			Counters                   map[string]int
			OwnedBy                    *string `json:"owned_by"`
			OwnerProcess               *string `json:"owner_process"`
			OwnedSince                 *string `json:"owned_since"`
			UnownedSince               *string `json:"unowned_since"`
		}
	}
	r := f.do("GET", "/v1/ingest/status", adminToken, nil)
	if err := json.Unmarshal(r.body, &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Partitions) != 2 || st.Partitions[0].Lag != 10 || *st.Partitions[0].AppliedThrough != "2026-11-20T11:59:58Z" ||
		st.Partitions[0].Counters["applied"] != 299 || st.Partitions[1].AppliedThrough != nil || st.Partitions[1].Lag != 0 {
		t.Fatalf("status: %s", r.body)
	}
	if p := st.Partitions[0]; p.OwnedBy == nil || *p.OwnedBy != "tally-1" || *p.OwnerProcess != "host-a:41" ||
		*p.OwnedSince != "2026-11-20T11:00:00Z" || p.UnownedSince != nil {
		t.Errorf("owned partition: %s", r.body)
	}
	if p := st.Partitions[1]; p.OwnedBy != nil || p.OwnerProcess != nil || p.OwnedSince != nil ||
		p.UnownedSince == nil || *p.UnownedSince != "2026-11-20T11:59:30Z" {
		t.Errorf("partition whose owner's lease ran out: %s", r.body)
	}
	f.do("GET", "/v1/ingest/status", f.token("acme"), nil).problem(t, 403, "urn:tally:problem:forbidden")
	f.do("GET", "/v1/ingest/status?topic=x", adminToken, nil).problem(t, 400, "urn:tally:problem:invalid-request")
	f.do("GET", "/v1/ingest/status", "", nil).problem(t, 401, "urn:tally:problem:unauthorized")
}

func TestDeadLettersListAndReplay(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // now: 2026-11-20T12:00Z
	// A message refused before a fix (say the producer's clock ran ahead):
	// valid now. And one that will never be.
	msg, err := wire.Encode(wire.Batch{Schema: wire.Schema, BatchID: uuid.Must(uuid.NewV7()), Producer: "gw-1", Epoch: 1,
		SentAt: date("2026-11-20T11:00:00Z"), Records: []wire.Record{{OperationID: uuid.Must(uuid.NewV7()), Customer: "acme",
			Meter: "api_calls", Seq: 1, Total: decimal.RequireFromString("42"), OccurredAt: date("2026-11-20T10:00:00Z")}}})
	if err != nil {
		t.Fatal(err)
	}
	good, bad, other := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	f.exec(`INSERT INTO dead_letters (id, topic, partition, "offset", reason, detail, key, raw, created_at) VALUES
		($1, 'tally.meter-batches', 0, 7, 'clock_skew', 'occurred_at is in the future', 'acme', $2, '2026-11-20T11:00:00Z'),
		($3, 'tally.meter-batches', 0, 8, 'bad_json', 'unexpected end of JSON', 'acme', '{"schema":', '2026-11-20T11:00:01Z'),
		($4, 'tally.meter-batches', 1, 3, 'bad_json', 'unexpected end of JSON', 'globex', 'x', '2026-11-20T11:00:02Z')`,
		good, msg, bad, other)

	type page struct {
		Items []struct {
			ID            string  `json:"id"`
			Key           string  `json:"key"`
			ReplayedAt    *string `json:"replayed_at"`
			ReplayOutcome *string `json:"replay_outcome"`
		} `json:"items"`
		NextCursor string `json:"next_cursor"`
	}
	list := func(query string) page {
		t.Helper()
		r := f.do("GET", "/v1/dead-letters"+query, adminToken, nil)
		var p page
		if err := json.Unmarshal(r.body, &p); err != nil || r.status != 200 {
			t.Fatalf("%s: %d %v %s", query, r.status, err, r.body)
		}
		return p
	}
	p := list("?customer=acme&limit=1")
	if len(p.Items) != 1 || p.Items[0].ID != good.String() || p.NextCursor == "" {
		t.Fatalf("page 1: %+v", p)
	}
	p = list("?customer=acme&limit=1&cursor=" + p.NextCursor)
	if len(p.Items) != 1 || p.Items[0].ID != bad.String() || p.NextCursor != "" {
		t.Fatalf("page 2: %+v", p)
	}
	if p := list(""); len(p.Items) != 3 {
		t.Fatalf("all: %+v", p)
	}

	// Replayed: booked once; a second replay is refused.
	r := f.do("POST", "/v1/dead-letters/"+good.String()+"/replay", adminToken, nil)
	res := r.json(t)
	if r.status != 200 || res["replayed"] != true || res["outcomes"].(map[string]any)["applied"] != 1.0 ||
		res["dead_letter"].(map[string]any)["replayed_at"] != "2026-11-20T12:00:00Z" {
		t.Fatalf("replay: %d %s", r.status, r.body)
	}
	if u := f.do("GET", "/v1/customers/acme/usage?meter=api_calls", adminToken, nil).json(t); u["total"] != "42" {
		t.Fatalf("usage after replay: %v", u)
	}
	p409 := f.do("POST", "/v1/dead-letters/"+good.String()+"/replay", adminToken, nil).problem(t, 409, "urn:tally:problem:already-replayed")
	if !strings.Contains(p409.Detail, "replayed before") {
		t.Fatalf("detail %q", p409.Detail)
	}
	// Refused again: 200, still pending, with the reason noted.
	r = f.do("POST", "/v1/dead-letters/"+bad.String()+"/replay", adminToken, nil)
	res = r.json(t)
	if r.status != 200 || res["replayed"] != false || !strings.HasPrefix(res["detail"].(string), "refused again") {
		t.Fatalf("refused again: %d %s", r.status, r.body)
	}
	got := f.do("GET", "/v1/dead-letters/"+bad.String(), adminToken, nil).json(t)
	if got["replayed_at"] != nil || !strings.HasPrefix(got["replay_outcome"].(string), "refused again") || got["raw"] != `{"schema":` {
		t.Fatalf("after refused replay: %v", got)
	}
	p = list("?pending=true")
	if len(p.Items) != 2 || p.Items[0].ID != bad.String() || p.Items[1].ID != other.String() {
		t.Fatalf("pending: %+v", p)
	}

	// Errors.
	missing := uuid.Must(uuid.NewV7()).String()
	f.do("GET", "/v1/dead-letters/"+missing, adminToken, nil).problem(t, 404, "urn:tally:problem:not-found")
	f.do("POST", "/v1/dead-letters/"+missing+"/replay", adminToken, nil).problem(t, 404, "urn:tally:problem:not-found")
	f.do("GET", "/v1/dead-letters/42", adminToken, nil).problem(t, 400, "urn:tally:problem:invalid-request")
	f.do("POST", "/v1/dead-letters/"+bad.String()+"/replay", f.token("acme"), nil).problem(t, 403, "urn:tally:problem:forbidden")
	f.do("GET", "/v1/dead-letters", f.token("acme"), nil).problem(t, 403, "urn:tally:problem:forbidden")
	pr := f.do("GET", "/v1/dead-letters?pending=maybe&customer=a%20b&limit=5000&cursor=c1.x", adminToken, nil).problem(t, 400, "urn:tally:problem:invalid-request")
	if got := strings.Join(fields(pr), ","); got != "cursor,customer,limit,pending" {
		t.Fatalf("fields %s", got)
	}
}

// A partition retrying its micro-batch for over a minute is visible: its
// state, since when and its last error in /v1/ingest/status, and /readyz is
// not ready, naming it. One retrying for less is shown but still ready.
func TestIngestStallVisible(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.exec(`INSERT INTO ingest_partitions (topic, partition, next_offset, retrying_since, last_error) VALUES
		('tally.meter-batches', 0, 7, now() - interval '10 seconds', 'commit: connection refused'),
		('tally.meter-batches', 1, 3, NULL, NULL)`)
	if m := f.do("GET", "/readyz", "", nil).json(t); m["status"] != "ready" {
		t.Fatalf("readyz while retrying for 10s: %v", m)
	}
	f.exec(`INSERT INTO ingest_partitions (topic, partition, next_offset, retrying_since, last_error) VALUES
		('tally.meter-batches', 2, 9, now() - interval '2 minutes', 'dead letters and counters: ERROR: no space left on device (SQLSTATE 53100)')`)
	var st struct {
		Partitions []struct {
			Partition     int
			State         string
			RetryingSince *string `json:"retrying_since"`
			LastError     string  `json:"last_error"`
		}
	}
	r := f.do("GET", "/v1/ingest/status", adminToken, nil)
	if err := json.Unmarshal(r.body, &st); err != nil {
		t.Fatal(err)
	}
	want := []string{"retrying", "consuming", "stalled"}
	if len(st.Partitions) != 3 {
		t.Fatalf("status: %s", r.body)
	}
	for i, p := range st.Partitions {
		if p.State != want[i] || (p.RetryingSince == nil) != (i == 1) || (p.LastError == "") != (i == 1) {
			t.Errorf("partition %d: state %q since %v error %q; want %s", p.Partition, p.State, p.RetryingSince, p.LastError, want[i])
		}
	}
	// /readyz reuses its answer for up to ReadyFor (a flood of probes asks
	// Postgres once a second): wait that long for the first answer to age.
	time.Sleep(api.ReadyFor)
	p := f.do("GET", "/readyz", "", nil).problem(t, 503, "urn:tally:problem:not-ready")
	if !strings.Contains(p.Detail, "tally.meter-batches/2 retrying since") || !strings.Contains(p.Detail, "SQLSTATE 53100") ||
		strings.Contains(p.Detail, "/0 ") {
		t.Fatalf("readyz detail %q, want partition 2 named with its error, and only it", p.Detail)
	}
}

// A dead letter shows what arrived: a null value (a Kafka tombstone) and a
// null key as null, an empty value as "", and bytes that are not UTF-8 in
// base64 as well.
func TestDeadLetterNullEmptyAndBinary(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.exec(`INSERT INTO dead_letters (id, topic, partition, "offset", reason, detail, key, raw, created_at) VALUES
		('019a3c8e-7a40-7000-8000-000000000001', 'tally.meter-batches', 0, 1, 'bad_json', 'null', 'acme', NULL, now()),
		('019a3c8e-7a40-7000-8000-000000000002', 'tally.meter-batches', 0, 2, 'bad_json', 'empty', NULL, '', now()),
		('019a3c8e-7a40-7000-8000-000000000003', 'tally.meter-batches', 0, 3, 'bad_key', 'binary', '\xff00', '\x7b00ff', now())`)
	r := f.do("GET", "/v1/dead-letters", adminToken, nil)
	var page struct{ Items []map[string]any }
	if err := json.Unmarshal(r.body, &page); err != nil || len(page.Items) != 3 {
		t.Fatalf("%v: %s", err, r.body)
	}
	tomb, empty, bin := page.Items[0], page.Items[1], page.Items[2]
	if tomb["raw"] != nil || tomb["key"] != "acme" {
		t.Errorf("tombstone: %v", tomb)
	}
	if empty["raw"] != "" || empty["key"] != nil {
		t.Errorf("empty value with a null key: %v", empty)
	}
	if bin["raw_base64"] != "ewD/" || bin["key_base64"] != "/wA=" || bin["raw"] != "{\x00\uFFFD" {
		t.Errorf("binary: %v", bin)
	}
	if _, ok := tomb["raw_base64"]; ok {
		t.Errorf("raw_base64 shown for valid UTF-8: %v", tomb)
	}
}

// TestReadyzUnownedPartition: /readyz answers 503 once a partition of the
// API's topic has had no live ingest owner for UnownedAfter, and 200 while
// every partition's lease is live or ran out more recently.
func TestReadyzUnownedPartition(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, func(c *api.Config) { c.UnownedAfter = time.Minute })
	f.exec(`INSERT INTO ingest_partitions (topic, partition, next_offset) VALUES ('tally.meter-batches', 0, 0), ('tally.meter-batches', 1, 0), ('other.topic', 0, 0)`)
	f.exec(`INSERT INTO ingest_partition_owners (topic, partition, consumer_group, member, generation, process, since, lease_until) VALUES
		('tally.meter-batches', 0, 'tally-ingest', 'tally-1', 3, 'host-a:41', now(), now() + interval '6 seconds'),
		('tally.meter-batches', 1, 'tally-ingest', 'tally-2', 3, 'host-b:42', now(), now() - interval '10 seconds'),
		('other.topic', 0, 'tally-ingest', NULL, 3, '', now(), now() - interval '1 hour')`)
	f.exec(`INSERT INTO ingest_members (topic, consumer_group, member, process, lease_until) VALUES
		('tally.meter-batches', 'tally-ingest', 'tally-1', 'host-a:41', now() + interval '1 hour'),
		('tally.meter-batches', 'tally-ingest', 'tally-2', 'host-b:42', now() - interval '10 seconds')`)
	if r := f.do("GET", "/readyz", "", nil); r.status != 200 {
		t.Fatalf("a lease that ran out 10s ago, UnownedAfter 1m: %d %s", r.status, r.body)
	}
	f.exec(`UPDATE ingest_members SET lease_until = now() - interval '61 seconds' WHERE member = 'tally-2'`)
	time.Sleep(api.ReadyFor) // /readyz reuses its answer that long
	p := f.do("GET", "/readyz", "", nil).problem(t, 503, "urn:tally:problem:not-ready")
	if !strings.Contains(p.Detail, "without a live ingest owner") || !strings.Contains(p.Detail, " 1 (since ") {
		t.Errorf("detail %q", p.Detail)
	}
	// Claimed again: ready.
	f.exec(`UPDATE ingest_partition_owners SET member = 'tally-1', generation = 4 WHERE topic = 'tally.meter-batches' AND partition = 1`)
	time.Sleep(api.ReadyFor)
	if r := f.do("GET", "/readyz", "", nil); r.status != 200 {
		t.Fatalf("every partition owned: %d %s", r.status, r.body)
	}

	off := newFixtureWith(t, func(c *api.Config) { c.UnownedAfter = -1 })
	off.exec(`INSERT INTO ingest_partitions (topic, partition, next_offset, updated_at) VALUES ('tally.meter-batches', 0, 0, now() - interval '1 day')`)
	if r := off.do("GET", "/readyz", "", nil); r.status != 200 {
		t.Fatalf("check off: %d %s", r.status, r.body)
	}
}

// A record's dead letter refused again on replay names the record by its
// place in the message it came in (records[1].total, as its field does),
// not by its place in the one-record message the replay wraps it in.
func TestReplayRefusedAgainNamesTheRecordsOwnField(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := uuid.Must(uuid.NewV7())
	f.exec(`INSERT INTO dead_letters (id, topic, partition, "offset", record_index, reason, field, detail, key, raw, producer, epoch, created_at) VALUES
		($1, 'tally.meter-batches', 0, 3, 1, 'bad_decimal', 'records[1].total', '1.5 is a JSON number', 'acme',
		 '{"operation_id":"01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a12","customer":"acme","meter":"api_calls","seq":2,"total":1.5,"occurred_at":"2026-11-20T09:59:02Z"}',
		 'gw-1', 3, '2026-11-20T11:00:00Z')`, id)
	res := f.do("POST", "/v1/dead-letters/"+id.String()+"/replay", adminToken, nil).json(t)
	detail, _ := res["detail"].(string)
	if res["replayed"] != false || !strings.HasPrefix(detail, "refused again: records[1].total: ") {
		t.Fatalf("replay: %v", res)
	}
	if got := f.do("GET", "/v1/dead-letters/"+id.String(), adminToken, nil).json(t); got["replay_outcome"] != detail {
		t.Errorf("replay_outcome %v, want %q", got["replay_outcome"], detail)
	}
}

// A record that is not a JSON object is refused by the decoder as a whole
// message once wrapped; the replay names it at its own place too.
func TestReplayRefusedAgainNamesAWrongRecordAtItsPlace(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := uuid.Must(uuid.NewV7())
	f.exec(`INSERT INTO dead_letters (id, topic, partition, "offset", record_index, reason, field, detail, key, raw, producer, epoch, created_at) VALUES
		($1, 'tally.meter-batches', 0, 3, 2, 'wrong_type', 'records[2]', 'not an object', 'acme', '17', 'gw-1', 3, '2026-11-20T11:00:00Z')`, id)
	res := f.do("POST", "/v1/dead-letters/"+id.String()+"/replay", adminToken, nil).json(t)
	if detail, _ := res["detail"].(string); res["replayed"] != false || !strings.HasPrefix(detail, "refused again: records[2]") {
		t.Fatalf("replay: %v", res)
	}
}
