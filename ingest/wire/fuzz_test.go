package wire_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/ingest/wire"
)

// FuzzDecode checks, for any key and value, that Decode does not panic; that
// a rejected message comes with a known reason and nothing else; that every
// record sent is either accepted or rejected, once; that every accepted value
// obeys the rules of docs/design.md §2, re-checked here from encoding/json's reading of
// the same bytes; and that what Decode accepts survives Encode and Decode
// unchanged.
func FuzzDecode(f *testing.F) {
	for _, s := range readSamples(f) {
		value, err := os.ReadFile(filepath.Join(samplesDir, s.file))
		if err != nil {
			f.Fatal(err)
		}
		if len(value) > 64<<10 { // too big to be a useful seed
			continue
		}
		f.Add([]byte(s.key), value)
	}
	f.Fuzz(func(t *testing.T, key, value []byte) {
		b, index, rejected, err := wire.Decode(key, value)
		if err != nil {
			var e *wire.Error
			if !errors.As(err, &e) || !slices.Contains(wire.Reasons(), e.Reason) || e.Detail == "" || !isText(e.Detail) {
				t.Fatalf("message error %#v", err)
			}
			if b.Records != nil || b.Schema != "" || index != nil || rejected != nil {
				t.Fatalf("message error %v came with results", err)
			}
			if !json.Valid(value) && e.Reason != wire.ReasonBadJSON && e.Reason != wire.ReasonBadKey &&
				e.Reason != wire.ReasonMessageTooLarge {
				t.Fatalf("invalid JSON rejected as %v", err)
			}
			return
		}
		checkAccepted(t, key, value, b, index, rejected)
		for _, r := range rejected {
			if !isText(r.Err.Detail) {
				t.Fatalf("record error detail %q is not text (dead_letters.detail)", r.Err.Detail)
			}
		}

		if len(b.Records) == 0 {
			return
		}
		enc, err := wire.Encode(b)
		if err != nil {
			var e *wire.Error
			if errors.As(err, &e) && e.Reason == wire.ReasonMessageTooLarge {
				return // integers re-encode as strings, 2 bytes longer each
			}
			t.Fatalf("Encode of a decoded batch: %v", err)
		}
		again, index2, rejected2, err := wire.Decode(key, enc)
		if err != nil || len(rejected2) > 0 {
			t.Fatalf("Decode(Encode(b)): %v %v\n%s", err, rejected2, enc)
		}
		if d := diffBatch(b, again); d != "" {
			t.Fatalf("Decode(Encode(b)) differs: %s\n%s", d, enc)
		}
		if len(index2) != len(again.Records) {
			t.Fatalf("index %v for %d records", index2, len(again.Records))
		}
		if enc2, err := wire.Encode(again); err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("Encode is not stable:\n%s\n%s", enc, enc2)
		}
	})
}

var (
	idRE   = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)
	uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	decRE  = regexp.MustCompile(`^-?[0-9]+(\.[0-9]+)?$`)
	intRE  = regexp.MustCompile(`^-?[0-9]+$`)
)

// checkAccepted re-reads an accepted message with encoding/json and checks
// every rule independently of the decoder.
func checkAccepted(t *testing.T, key, value []byte, b wire.Batch, index []int, rejected []wire.RecordError) {
	t.Helper()
	if len(value) > wire.MaxMessageBytes || !isID(string(key)) {
		t.Fatalf("accepted a message of %d bytes with key %q", len(value), key)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(value, &top); err != nil {
		t.Fatalf("accepted a message encoding/json rejects: %v", err)
	}
	for k := range top {
		if !slices.Contains([]string{"schema", "batch_id", "producer", "epoch", "sent_at", "records"}, k) {
			t.Fatalf("accepted unknown field %q", k)
		}
	}
	if s := str(t, top["schema"]); s != wire.Schema || b.Schema != s {
		t.Fatalf("accepted schema %q", s)
	}
	checkUUID(t, top["batch_id"], b.BatchID)
	p := str(t, top["producer"])
	// encoding/json reads invalid UTF-8 and unpaired surrogates as U+FFFD,
	// so a decoder that let them through would disagree with it here.
	if p != b.Producer || p == "" || utf8.RuneCountInString(p) > wire.MaxIDLen || !utf8.ValidString(b.Producer) ||
		strings.ContainsFunc(p, unicode.IsControl) {
		t.Fatalf("accepted producer %q (encoding/json reads %q)", b.Producer, p)
	}
	if checkInt(t, top["epoch"]) != b.Epoch {
		t.Fatalf("epoch %d", b.Epoch)
	}
	checkTime(t, top["sent_at"], b.SentAt)

	var records []json.RawMessage
	if err := json.Unmarshal(top["records"], &records); err != nil {
		t.Fatalf("records: %v", err)
	}
	if n := len(records); n == 0 || n > wire.MaxRecords || len(b.Records)+len(rejected) != n || len(index) != len(b.Records) {
		t.Fatalf("%d records sent, %d accepted (index %v), %d rejected", n, len(b.Records), index, len(rejected))
	}
	seen := make([]bool, len(records))
	for _, re := range rejected {
		if seen[re.Index] || !bytes.Equal(re.Raw, records[re.Index]) || !slices.Contains(wire.Reasons(), re.Err.Reason) ||
			!strings.HasPrefix(re.Err.Field, "records["+strconv.Itoa(re.Index)+"]") {
			t.Fatalf("rejected %d %s as %v; the record is %s", re.Index, re.Raw, re.Err, records[re.Index])
		}
		seen[re.Index] = true
	}
	for i, x := range index {
		if seen[x] || i > 0 && x <= index[i-1] {
			t.Fatalf("index %v overlaps or is out of order (rejected %v)", index, rejected)
		}
		seen[x] = true
		checkRecord(t, string(key), records[x], b.Records[i])
	}
}

func checkRecord(t *testing.T, key string, raw json.RawMessage, r wire.Record) {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("accepted record %s: %v", raw, err)
	}
	for k := range m {
		if !slices.Contains([]string{"operation_id", "customer", "meter", "seq", "total", "quantity", "occurred_at", "final", "level", "member"}, k) {
			t.Fatalf("accepted unknown record field %q", k)
		}
	}
	checkUUID(t, m["operation_id"], r.OperationID)
	if c := str(t, m["customer"]); c != key || r.Customer != c || !isID(c) {
		t.Fatalf("accepted customer %q under key %q", c, key)
	}
	if s := str(t, m["meter"]); s != r.Meter || !isID(s) {
		t.Fatalf("accepted meter %q", s)
	}
	if checkInt(t, m["seq"]) != r.Seq {
		t.Fatalf("seq %d", r.Seq)
	}
	// Exactly one of total (a counter), level (a gauge) and member (a
	// unique count), docs/design.md §16.
	_, hasTotal := m["total"]
	_, hasLevel := m["level"]
	_, hasMember := m["member"]
	if n := btoi(hasTotal) + btoi(hasLevel) + btoi(hasMember); n != 1 {
		t.Fatalf("accepted a record with %d of total, level and member: %s", n, raw)
	}
	switch {
	case hasLevel:
		if !r.Level.Valid || r.Member != "" {
			t.Fatalf("level %s read as %v, member %q", m["level"], r.Level, r.Member)
		}
		checkDecimal(t, m["level"], r.Level.Decimal)
		if q, ok := m["quantity"]; ok && string(q) != "null" {
			t.Fatalf("accepted a gauge record with a quantity: %s", raw)
		}
	case hasMember:
		mem := str(t, m["member"])
		if mem != r.Member || r.Level.Valid || mem == "" || utf8.RuneCountInString(mem) > wire.MaxMemberLen ||
			!utf8.ValidString(r.Member) || strings.ContainsFunc(mem, unicode.IsControl) {
			t.Fatalf("accepted member %q (encoding/json reads %q)", r.Member, mem)
		}
		if q, ok := m["quantity"]; ok && string(q) != "null" {
			t.Fatalf("accepted a unique record with a quantity: %s", raw)
		}
	default:
		if r.Level.Valid || r.Member != "" {
			t.Fatalf("a counter record read as level %v member %q", r.Level, r.Member)
		}
		checkDecimal(t, m["total"], r.Total)
	}
	if q, ok := m["quantity"]; ok && string(q) != "null" {
		if !r.Quantity.Valid {
			t.Fatalf("quantity %s lost", q)
		}
		checkDecimal(t, q, r.Quantity.Decimal)
	} else if r.Quantity.Valid {
		t.Fatalf("quantity %v from nowhere", r.Quantity)
	}
	checkTime(t, m["occurred_at"], r.OccurredAt)
	if r.OccurredAt.Before(wire.MinOccurredAt) || !r.OccurredAt.Before(wire.MaxOccurredAt) {
		t.Fatalf("accepted occurred_at %v, outside the periods Tally keeps", r.OccurredAt)
	}
	if f, ok := m["final"]; ok && string(f) != "null" {
		var final bool
		if err := json.Unmarshal(f, &final); err != nil || final != r.Final {
			t.Fatalf("final %s read as %v", f, r.Final)
		}
	} else if r.Final {
		t.Fatal("final from nowhere")
	}
}

func str(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("accepted %s as a string: %v", raw, err)
	}
	return s
}

func checkUUID(t *testing.T, raw json.RawMessage, got uuid.UUID) {
	t.Helper()
	s := str(t, raw)
	if !uuidRE.MatchString(s) || uuid.MustParse(s) != got || got == uuid.Nil {
		t.Fatalf("accepted UUID %q as %v", s, got)
	}
}

func checkInt(t *testing.T, raw json.RawMessage) int64 {
	t.Helper()
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if !intRE.Match(raw) || err != nil || n < 1 {
		t.Fatalf("accepted %s as a positive integer", raw)
	}
	return n
}

func checkDecimal(t *testing.T, raw json.RawMessage, got decimal.Decimal) {
	t.Helper()
	s := string(raw)
	if raw[0] == '"' {
		s = str(t, raw)
	}
	if !decRE.MatchString(s) || len(s) > 80 {
		t.Fatalf("accepted decimal %s", raw)
	}
	want, err := decimal.NewFromString(s)
	if err != nil || !want.Equal(got) || got.Sign() < 0 {
		t.Fatalf("accepted decimal %s as %v", raw, got)
	}
	// Count digits on the text: no leading zeros, no trailing fraction zeros.
	intPart, frac, _ := strings.Cut(strings.TrimPrefix(s, "-"), ".")
	intPart = strings.TrimLeft(intPart, "0")
	frac = strings.TrimRight(frac, "0")
	sig := strings.TrimLeft(intPart+frac, "0")
	if len(frac) > 9 || len(sig) > 38 {
		t.Fatalf("accepted decimal %s out of range", raw)
	}
}

func checkTime(t *testing.T, raw json.RawMessage, got time.Time) {
	t.Helper()
	s := strings.ToUpper(str(t, raw)) // RFC 3339 allows lower-case t and z
	want, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || !want.Equal(got) || got.Location() != time.UTC || got.Year() < 1970 || got.Year() > 9999 {
		t.Fatalf("accepted time %s as %v (%v)", raw, got, err)
	}
	if _, frac, ok := strings.Cut(s, "."); ok {
		n := strings.IndexFunc(frac, func(r rune) bool { return r < '0' || r > '9' })
		if n < 1 || n > 9 {
			t.Fatalf("accepted time %s with %d fractional digits", raw, n)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// isText: storable as Postgres text (valid UTF-8, no NUL).
func isText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// isID: an id by docs/design.md §2, re-checked apart from the decoder.
func isID(s string) bool { return idRE.MatchString(s) && s != "." && s != ".." }
