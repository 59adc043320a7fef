package ledger_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tally-ledger/tally/ledger"
)

// TestOperationIDReusedPastLastSeq: Apply looks up only the operation ids
// of records at or below their stream's last seq; a record past it that
// reuses a recorded id (from another stream) is caught by the unique key
// when the records are written, and the batch is applied again with every
// id looked up. The outcomes, the ledger and the rollups are those of
// applying the records one at a time.
func TestOperationIDReusedPastLastSeq(t *testing.T) {
	f := newFixture(t)
	var logs bytes.Buffer
	l, err := ledger.New(ledger.Config{Clock: func() time.Time { return f.now },
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	f.l = l
	s1 := recBuilder{"gw-1", 1, "acme", "api_calls"}
	s2 := recBuilder{"gw-1", 1, "acme", "bytes"}

	if got := kinds(f.apply(s1.rec(1, "10", nov))); got != "applied" {
		t.Fatalf("outcomes = %s", got)
	}
	reused := s2.rec(1, "5", nov) // past s2's last seq (0), under s1's first operation id
	reused.OperationID = opID(s1, 1)
	batch := []ledger.Record{reused, s2.rec(2, "7", nov), s1.rec(2, "12", nov)}
	if got := kinds(f.apply(batch...)); got != "conflict(operation_id_reused) applied applied" {
		t.Fatalf("outcomes = %s", got)
	}
	if !strings.Contains(logs.String(), "applying the batch again") {
		t.Fatalf("the batch was not applied again; logs: %s", logs.String())
	}
	for sql, want := range map[string]string{
		`SELECT trim_scale(sum(billed))::text FROM records`:                            "19",
		`SELECT count(*)::text FROM records`:                                           "3",
		`SELECT trim_scale(sum(quantity))::text FROM rollups WHERE customer = 'acme'`:  "19",
		`SELECT count(*)::text FROM conflicts WHERE reason = 'operation_id_reused'`:    "1",
		`SELECT count(*)::text FROM gaps`:                                              "1",
		`SELECT string_agg(meter || ':' || last_seq, ',' ORDER BY meter) FROM streams`: "api_calls:2,bytes:2",
	} {
		if got := f.scalar(sql); got != want {
			t.Errorf("%s = %s, want %s", sql, got, want)
		}
	}
	// The same batch again: everything is now at or below the last seqs.
	logs.Reset()
	if got := kinds(f.apply(batch...)); got != "conflict(operation_id_reused) duplicate duplicate" {
		t.Fatalf("outcomes again = %s", got)
	}
	if logs.Len() != 0 {
		t.Fatalf("applied again on a retransmit: %s", logs.String())
	}
}
