package wire_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"
	"pgregory.net/rapid"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/ingest/wire"
)

const samplesDir = "../../testdata/batches"

// sample is one row of the table in testdata/batches/README.md.
type sample struct {
	file     string
	key      string
	expect   string // "ok" or a Reason
	accepted int    // -1 when the message is rejected
}

// readSamples parses the README table, which is the oracle for the files.
func readSamples(t testing.TB) []sample {
	t.Helper()
	f, err := os.Open(filepath.Join(samplesDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []sample
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cols := strings.Split(line, "|")
		if len(cols) < 6 {
			t.Fatalf("README row %q: want 5 columns", line)
		}
		cell := func(i int) string { return strings.Trim(strings.TrimSpace(cols[i]), "`") }
		s := sample{file: cell(1), key: cell(2), expect: cell(3), accepted: -1}
		if a := cell(4); a != "-" {
			if s.accepted, err = strconv.Atoi(a); err != nil {
				t.Fatalf("README row %q: accepted %q", line, a)
			}
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSamples(t *testing.T) {
	samples := readSamples(t)
	files, err := filepath.Glob(filepath.Join(samplesDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, s := range samples {
		listed[s.file] = true
	}
	for _, f := range files {
		if !listed[filepath.Base(f)] {
			t.Errorf("%s is not in %s/README.md", filepath.Base(f), samplesDir)
		}
	}
	covered := map[wire.Reason]bool{}
	for _, s := range samples {
		t.Run(s.file, func(t *testing.T) {
			value, err := os.ReadFile(filepath.Join(samplesDir, s.file))
			if err != nil {
				t.Fatalf("README lists %s: %v", s.file, err)
			}
			if s.expect != "ok" && s.file != "invalid-"+s.expect+".json" {
				t.Errorf("file for reason %s should be named invalid-%s.json", s.expect, s.expect)
			}
			b, index, rejected, err := wire.Decode([]byte(s.key), value)
			switch {
			case s.expect == "ok":
				if !strings.HasPrefix(s.file, "valid-") {
					t.Errorf("expect ok, but the file is not named valid-*")
				}
				if err != nil || len(rejected) > 0 {
					t.Fatalf("Decode: %v, rejected %v", err, rejected)
				}
			case s.accepted < 0: // message level
				var e *wire.Error
				if !errors.As(err, &e) {
					t.Fatalf("Decode error = %v (rejected %v), want a message error %s", err, rejected, s.expect)
				}
				if string(e.Reason) != s.expect {
					t.Fatalf("Decode error = %v, want reason %s", err, s.expect)
				}
				covered[e.Reason] = true
				return
			default: // record level
				if err != nil {
					t.Fatalf("Decode error = %v, want record errors %s", err, s.expect)
				}
				if len(rejected) == 0 {
					t.Fatalf("no record rejected, want %s", s.expect)
				}
				for _, re := range rejected {
					if string(re.Err.Reason) != s.expect {
						t.Errorf("records[%d] rejected with %v, want reason %s", re.Index, re.Err, s.expect)
					}
					covered[re.Err.Reason] = true
				}
			}
			if len(b.Records) != s.accepted {
				t.Errorf("accepted %d records, README says %d", len(b.Records), s.accepted)
			}
			if len(index) != len(b.Records) {
				t.Errorf("len(index) = %d, len(Records) = %d", len(index), len(b.Records))
			}
			for _, r := range b.Records {
				if r.Customer != s.key {
					t.Errorf("accepted record of customer %q under key %q", r.Customer, s.key)
				}
			}
		})
	}
	for _, r := range wire.Reasons() {
		if !covered[r] {
			t.Errorf("no sample in %s shows reason %s", samplesDir, r)
		}
	}
}

// A valid message to edit in the tests below.
const (
	okRecord = `{"operation_id":"01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a11","customer":"acme","meter":"api_calls","seq":1,"total":"5","occurred_at":"2026-12-02T09:59:58Z"}`
	okTop    = `{"schema":"meter.batch.v1","batch_id":"01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a10","producer":"gateway-eu-1","epoch":3,"sent_at":"2026-12-02T10:00:00.120Z","records":[RECORDS]}`
)

// message returns okTop with the given records.
func message(records ...string) string {
	return strings.Replace(okTop, "RECORDS", strings.Join(records, ","), 1)
}

// edit replaces old by new in s, once; old must be there.
func edit(s, old, new string) string {
	if !strings.Contains(s, old) {
		panic(fmt.Sprintf("edit: %q not in %s", old, s))
	}
	return strings.Replace(s, old, new, 1)
}

// rec returns okRecord with one edit.
func rec(old, new string) string { return edit(okRecord, old, new) }

func TestDecodeMessageErrors(t *testing.T) {
	ok := message(okRecord)
	dupEpoch := edit(ok, `"epoch":3`, `"epoch":3,"epoch":4`)
	long := strings.Repeat("p", 129)
	for _, tc := range []struct {
		name, key, value, want string
	}{
		{"too large", "acme", ok + strings.Repeat(" ", wire.MaxMessageBytes-len(ok)+1),
			"message is 1048577 bytes; at most 1048576 (1 MiB) (message_too_large)"},
		{"key not an id", "ácme", ok,
			`message key "ácme" has 'á' at byte 0; ids use only A-Z a-z 0-9 . _ : - (bad_key)`},
		{"key empty", "", ok,
			"message key is empty; ids are 1 to 128 characters of A-Z a-z 0-9 . _ : - (bad_key)"},
		{"key too long", strings.Repeat("k", 129), ok,
			`message key "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"... is 129 characters long; at most 128 (bad_key)`},
		{"truncated", "acme", `{"schema":`,
			"invalid JSON at offset 10: unexpected end of JSON input (bad_json)"},
		{"syntax", "acme", edit(ok, `"epoch":3`, `"epoch":3,}`),
			"invalid JSON at offset 114: invalid character '}' looking for beginning of object key string (bad_json)"},
		{"empty value", "acme", "",
			"message is empty (a tombstone, or a producer that sent no value); a message is one JSON object (bad_json)"},
		{"blank value", "acme", " \n",
			"message is empty (a tombstone, or a producer that sent no value); a message is one JSON object (bad_json)"},
		{"not an object", "acme", `[` + ok + `]`,
			"message must be a JSON object, got array (bad_json)"},
		{"repeated key", "acme", dupEpoch,
			fmt.Sprintf("epoch: key appears twice (again at offset %d); repeated keys are ambiguous (bad_json)",
				strings.LastIndex(dupEpoch, `"epoch"`))},
		{"other schema", "acme", edit(ok, `"meter.batch.v1"`, `"meter.batch.v2"`),
			`schema: "meter.batch.v2" is not a schema this decoder reads; want "meter.batch.v1" (unknown_schema)`},
		{"other schema with other fields", "acme", `{"schema":"usage.v7","customer":"acme"}`,
			`schema: "usage.v7" is not a schema this decoder reads; want "meter.batch.v1" (unknown_schema)`},
		{"schema missing", "acme", edit(ok, `"schema":"meter.batch.v1",`, ``),
			"schema: is missing (missing_field)"},
		{"schema not a string", "acme", edit(ok, `"meter.batch.v1"`, `1`),
			"schema: must be a string, got number 1 (wrong_type)"},
		{"unknown field", "acme", edit(ok, `"epoch":3`, `"epoch":3,"region":"eu"`),
			"region: is not a meter.batch.v1 field; a batch has schema, batch_id, producer, epoch, sent_at, records (unknown_field)"},
		{"odd unknown field", "acme", edit(ok, `"epoch":3`, `"epoch":3,"Epoch":3`),
			"Epoch: is not a meter.batch.v1 field; a batch has schema, batch_id, producer, epoch, sent_at, records (unknown_field)"},
		{"unknown field with spaces", "acme", edit(ok, `"epoch":3`, `"epoch":3,"sent at":3`),
			`["sent at"]: is not a meter.batch.v1 field; a batch has schema, batch_id, producer, epoch, sent_at, records (unknown_field)`},
		{"batch_id missing", "acme", edit(ok, `"batch_id":"01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a10",`, ``),
			"batch_id: is missing (missing_field)"},
		{"batch_id without hyphens", "acme", edit(ok, `01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a10`, `01938f2e6c1b7d4e9a513c2f9b7e4a10`),
			`batch_id: "01938f2e6c1b7d4e9a513c2f9b7e4a10" is not a UUID in the 8-4-4-4-12 hex form (bad_uuid)`},
		{"batch_id in braces", "acme", edit(ok, `"01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a10"`, `"{01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a10}"`),
			`batch_id: "{01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a10}" is not a UUID in the 8-4-4-4-12 hex form (bad_uuid)`},
		{"batch_id nil", "acme", edit(ok, `01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a10`, `00000000-0000-0000-0000-000000000000`),
			`batch_id: "00000000-0000-0000-0000-000000000000" is the nil UUID (bad_uuid)`},
		{"batch_id a number", "acme", edit(ok, `"01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a10"`, `42`),
			"batch_id: must be a string, got number 42 (wrong_type)"},
		{"producer empty", "acme", edit(ok, `"gateway-eu-1"`, `""`),
			"producer: is empty; producer ids are 1 to 128 characters (bad_id)"},
		{"producer too long", "acme", edit(ok, `"gateway-eu-1"`, `"`+long+`"`),
			`producer: "pppppppppppppppppppppppppppppppppppppppp"... is 129 characters long; at most 128 (bad_id)`},
		{"producer with a newline", "acme", edit(ok, `"gateway-eu-1"`, `"gateway\n1"`),
			`producer: "gateway\n1" has control character U+000A at byte 7 (bad_id)`},
		{"producer invalid UTF-8", "acme", edit(ok, `"gateway-eu-1"`, "\"gate\xffway\""),
			`producer: "gate\xffway" has invalid UTF-8 at byte 4 (bad_id)`},
		{"producer unpaired surrogate", "acme", edit(ok, `"gateway-eu-1"`, `"gw\ud800"`),
			`producer: "gw\ud800" has an unpaired UTF-16 surrogate escape (bad_id)`},
		{"epoch a string", "acme", edit(ok, `"epoch":3`, `"epoch":"3"`),
			`epoch: must be an integer, got string "3" (wrong_type)`},
		{"epoch null", "acme", edit(ok, `"epoch":3`, `"epoch":null`),
			`epoch: must be an integer, got null (wrong_type)`},
		{"epoch zero", "acme", edit(ok, `"epoch":3`, `"epoch":0`),
			"epoch: 0 is not positive; epochs start at 1 (bad_epoch)"},
		{"epoch negative", "acme", edit(ok, `"epoch":3`, `"epoch":-2`),
			"epoch: -2 is not positive; epochs start at 1 (bad_epoch)"},
		{"epoch fraction", "acme", edit(ok, `"epoch":3`, `"epoch":1.5`),
			"epoch: 1.5 is not an integer (bad_epoch)"},
		{"epoch exponent", "acme", edit(ok, `"epoch":3`, `"epoch":3e0`),
			"epoch: 3e0 is not an integer (bad_epoch)"},
		{"epoch too big", "acme", edit(ok, `"epoch":3`, `"epoch":9223372036854775808`),
			"epoch: 9223372036854775808 does not fit in a 64-bit integer (bad_epoch)"},
		{"sent_at without zone", "acme", edit(ok, `2026-12-02T10:00:00.120Z`, `2026-12-02T10:00:00.120`),
			`sent_at: "2026-12-02T10:00:00.120" is not an RFC 3339 timestamp with a zone, like "2026-12-02T10:00:00Z" (bad_timestamp)`},
		{"sent_at unix seconds", "acme", edit(ok, `"2026-12-02T10:00:00.120Z"`, `1796205600`),
			"sent_at: must be a string, got number 1796205600 (wrong_type)"},
		{"sent_at before 1970", "acme", edit(ok, `2026-12-02T10:00:00.120Z`, `1969-12-31T23:59:59Z`),
			`sent_at: "1969-12-31T23:59:59Z" is before 1970 (bad_timestamp)`},
		{"sent_at after 9999 in UTC", "acme", edit(ok, `2026-12-02T10:00:00.120Z`, `9999-12-31T23:00:00-01:00`),
			`sent_at: "9999-12-31T23:00:00-01:00" is after 9999 (bad_timestamp)`},
		{"records missing", "acme", edit(ok, `,"records":[`+okRecord+`]`, ``),
			"records: is missing (missing_field)"},
		{"records an object", "acme", edit(ok, `[`+okRecord+`]`, okRecord),
			"records: must be an array, got object (wrong_type)"},
		{"records empty", "acme", message(),
			"records: is empty; a message carries 1 to 10000 records (empty_batch)"},
		{"too many records", "acme", message(slices.Repeat([]string{"0"}, wire.MaxRecords+1)...),
			"records: has 10001 records; at most 10000 per message (too_many_records)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, index, rejected, err := wire.Decode([]byte(tc.key), []byte(tc.value))
			if err == nil {
				t.Fatalf("Decode accepted the message (rejected %v)", rejected)
			}
			if got := err.Error(); got != tc.want {
				t.Errorf("error\n got: %s\nwant: %s", got, tc.want)
			}
			var e *wire.Error
			if !errors.As(err, &e) {
				t.Errorf("error %T is not a *wire.Error", err)
			}
			if b.Records != nil || b.Schema != "" || index != nil || rejected != nil {
				t.Errorf("a message error came with results: %+v %v %v", b, index, rejected)
			}
		})
	}
}

func TestDecodeRecordErrors(t *testing.T) {
	dupTotal := message(okRecord, rec(`"total":"5"`, `"total":"5","total":"6"`))
	long := strings.Repeat("m", 129)
	for _, tc := range []struct {
		name, record, want string
	}{
		{"not an object", `5`, "records[1]: must be an object, got number 5 (wrong_type)"},
		{"null", `null`, "records[1]: must be an object, got null (wrong_type)"},
		{"unknown field", rec(`"seq":1`, `"seq":1,"amount":"5"`),
			"records[1].amount: is not a meter.batch.v1 record field; records have operation_id, customer, meter, seq, total, quantity, occurred_at, final, level, member (unknown_field)"},
		{"field in the wrong case", rec(`"seq":1`, `"Seq":1`),
			"records[1].Seq: is not a meter.batch.v1 record field; records have operation_id, customer, meter, seq, total, quantity, occurred_at, final, level, member (unknown_field)"},
		{"operation_id missing", rec(`"operation_id":"01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a11",`, ``),
			"records[1].operation_id: is missing (missing_field)"},
		{"operation_id short", rec(`01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a11`, `01938f2e-6c1b-7d4e-9a51`),
			`records[1].operation_id: "01938f2e-6c1b-7d4e-9a51" is not a UUID in the 8-4-4-4-12 hex form (bad_uuid)`},
		{"operation_id not hex", rec(`01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a11`, `01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a1g`),
			`records[1].operation_id: "01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a1g" is not a UUID in the 8-4-4-4-12 hex form (bad_uuid)`},
		{"operation_id nil", rec(`01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a11`, `00000000-0000-0000-0000-000000000000`),
			`records[1].operation_id: "00000000-0000-0000-0000-000000000000" is the nil UUID (bad_uuid)`},
		{"customer with an accent", rec(`"customer":"acme"`, `"customer":"ácme"`),
			`records[1].customer: "ácme" has 'á' at byte 0; ids use only A-Z a-z 0-9 . _ : - (bad_id)`},
		{"customer with a space", rec(`"customer":"acme"`, `"customer":"acme "`),
			`records[1].customer: "acme " has ' ' at byte 4; ids use only A-Z a-z 0-9 . _ : - (bad_id)`},
		{"customer empty", rec(`"customer":"acme"`, `"customer":""`),
			`records[1].customer: is empty; ids are 1 to 128 characters of A-Z a-z 0-9 . _ : - (bad_id)`},
		{"customer of another key", rec(`"customer":"acme"`, `"customer":"globex"`),
			`records[1].customer: "globex" is not the message key "acme"; a message carries only its key's customer (customer_mismatch)`},
		{"customer in another case", rec(`"customer":"acme"`, `"customer":"ACME"`),
			`records[1].customer: "ACME" is not the message key "acme"; a message carries only its key's customer (customer_mismatch)`},
		{"meter too long", rec(`"api_calls"`, `"`+long+`"`),
			`records[1].meter: "mmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmm"... is 129 characters long; at most 128 (bad_id)`},
		{"meter with a slash", rec(`"api_calls"`, `"api/calls"`),
			`records[1].meter: "api/calls" has '/' at byte 3; ids use only A-Z a-z 0-9 . _ : - (bad_id)`},
		{"meter escaped NUL", rec(`"api_calls"`, `"api\u0000"`),
			`records[1].meter: "api\x00" has '\x00' at byte 3; ids use only A-Z a-z 0-9 . _ : - (bad_id)`},
		{"seq zero", rec(`"seq":1`, `"seq":0`), "records[1].seq: 0 is below 1; seqs start at 1 (bad_seq)"},
		{"seq negative", rec(`"seq":1`, `"seq":-1`), "records[1].seq: -1 is below 1; seqs start at 1 (bad_seq)"},
		{"seq fraction", rec(`"seq":1`, `"seq":1.0`), "records[1].seq: 1.0 is not an integer (bad_seq)"},
		{"seq too big", rec(`"seq":1`, `"seq":99999999999999999999`),
			"records[1].seq: 99999999999999999999 does not fit in a 64-bit integer (bad_seq)"},
		{"seq a string", rec(`"seq":1`, `"seq":"1"`), `records[1].seq: must be an integer, got string "1" (wrong_type)`},
		{"total missing", rec(`"total":"5",`, ``), "records[1].total: is missing; a record carries a total (a counter), a level (a gauge) or a member (a unique count) (missing_field)"},
		{"total exponent string", rec(`"total":"5"`, `"total":"1e5"`),
			`records[1].total: "1e5" is not a decimal number (bad_decimal)`},
		{"total with a plus", rec(`"total":"5"`, `"total":"+5"`),
			`records[1].total: "+5" is not a decimal number (bad_decimal)`},
		{"total empty", rec(`"total":"5"`, `"total":""`),
			`records[1].total: "" is not a decimal number (bad_decimal)`},
		{"total a fractional number", rec(`"total":"5"`, `"total":1.5`),
			`records[1].total: 1.5 is a JSON number with a fraction or exponent; send exact decimals as strings, like "12.5" (bad_decimal)`},
		{"total an exponent number", rec(`"total":"5"`, `"total":1e3`),
			`records[1].total: 1e3 is a JSON number with a fraction or exponent; send exact decimals as strings, like "12.5" (bad_decimal)`},
		{"total a boolean", rec(`"total":"5"`, `"total":true`),
			`records[1].total: must be a decimal string such as "12.5", got boolean true (wrong_type)`},
		{"total ten digits after the point", rec(`"total":"5"`, `"total":"0.0000000001"`),
			`records[1].total: "0.0000000001" has more than 9 digits after the point (decimal_out_of_range)`},
		{"total 39 digits", rec(`"total":"5"`, `"total":"123456789012345678901234567890123456789"`),
			`records[1].total: "123456789012345678901234567890123456789" has more than 38 significant digits (decimal_out_of_range)`},
		{"total 39-digit JSON integer", rec(`"total":"5"`, `"total":123456789012345678901234567890123456789`),
			`records[1].total: 123456789012345678901234567890123456789 has more than 38 significant digits (decimal_out_of_range)`},
		{"total longer than 80 characters", rec(`"total":"5"`, `"total":"`+strings.Repeat("0", 80)+`1"`),
			`records[1].total: "0000000000000000000000000000000000000000"... is 81 characters long; at most 80 (decimal_out_of_range)`},
		{"total negative", rec(`"total":"5"`, `"total":"-1"`),
			`records[1].total: "-1" is negative; totals and quantities are never below zero (negative_value)`},
		{"total negative integer", rec(`"total":"5"`, `"total":-7`),
			`records[1].total: -7 is negative; totals and quantities are never below zero (negative_value)`},
		{"quantity negative", rec(`"total":"5"`, `"total":"5","quantity":"-0.5"`),
			`records[1].quantity: "-0.5" is negative; totals and quantities are never below zero (negative_value)`},
		{"quantity not a decimal", rec(`"total":"5"`, `"total":"5","quantity":"three"`),
			`records[1].quantity: "three" is not a decimal number (bad_decimal)`},
		{"occurred_at missing", rec(`,"occurred_at":"2026-12-02T09:59:58Z"`, ``),
			"records[1].occurred_at: is missing (missing_field)"},
		{"occurred_at with a space", rec(`2026-12-02T09:59:58Z`, `2026-12-02 09:59:58Z`),
			`records[1].occurred_at: "2026-12-02 09:59:58Z" is not an RFC 3339 timestamp with a zone, like "2026-12-02T10:00:00Z" (bad_timestamp)`},
		{"occurred_at February 30", rec(`2026-12-02T09:59:58Z`, `2026-02-30T09:59:58Z`),
			`records[1].occurred_at: "2026-02-30T09:59:58Z" is not an RFC 3339 timestamp with a zone, like "2026-12-02T10:00:00Z" (bad_timestamp)`},
		{"occurred_at one-digit hour", rec(`2026-12-02T09:59:58Z`, `2026-12-02T9:59:58+00:00`),
			`records[1].occurred_at: "2026-12-02T9:59:58+00:00" is not an RFC 3339 timestamp with a zone, like "2026-12-02T10:00:00Z" (bad_timestamp)`},
		{"occurred_at ten fractional digits", rec(`2026-12-02T09:59:58Z`, `2026-12-02T09:59:58.1234567891Z`),
			`records[1].occurred_at: "2026-12-02T09:59:58.1234567891Z" is not an RFC 3339 timestamp with a zone, like "2026-12-02T10:00:00Z" (bad_timestamp)`},
		{"occurred_at zero time", rec(`2026-12-02T09:59:58Z`, `0001-01-01T00:00:00Z`),
			`records[1].occurred_at: "0001-01-01T00:00:00Z" is before 1970-02-02, from which every calendar's period of it is one Tally keeps (bad_timestamp)`},
		{"meter ..", rec(`"meter":"api_calls"`, `"meter":".."`),
			`records[1].meter: ".." is a path segment; ids are 1 to 128 characters of A-Z a-z 0-9 . _ : -, not . or .. (bad_id)`},
		// A weekly period of 1970-01-02 starts in 1969: no period reference
		// could name it, nor close it.
		{"occurred_at in 1970's first days", rec(`2026-12-02T09:59:58Z`, `1970-01-02T00:00:00Z`),
			`records[1].occurred_at: "1970-01-02T00:00:00Z" is before 1970-02-02, from which every calendar's period of it is one Tally keeps (bad_timestamp)`},
		{"occurred_at in 9998's last month", rec(`2026-12-02T09:59:58Z`, `9998-12-01T00:00:00Z`),
			`records[1].occurred_at: "9998-12-01T00:00:00Z" is not before 9998-12-01, until which every calendar's period of it is one Tally keeps (bad_timestamp)`},
		{"final a string", rec(`"total":"5"`, `"total":"5","final":"yes"`),
			`records[1].final: must be true or false, got string "yes" (wrong_type)`},
		{"final a number", rec(`"total":"5"`, `"total":"5","final":1`),
			`records[1].final: must be true or false, got number 1 (wrong_type)`},
		{"first problem wins", rec(`"seq":1,"total":"5"`, `"seq":0,"total":"-5"`),
			"records[1].seq: 0 is below 1; seqs start at 1 (bad_seq)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			value := message(okRecord, tc.record, okRecord)
			b, index, rejected, err := wire.Decode([]byte("acme"), []byte(value))
			if err != nil {
				t.Fatalf("Decode rejected the message: %v", err)
			}
			if len(rejected) != 1 {
				t.Fatalf("rejected %d records (%v), want 1", len(rejected), rejected)
			}
			re := rejected[0]
			if got := re.Err.Error(); got != tc.want {
				t.Errorf("error\n got: %s\nwant: %s", got, tc.want)
			}
			if re.Error() != re.Err.Error() {
				t.Errorf("RecordError.Error() = %q", re.Error())
			}
			if re.Index != 1 || string(re.Raw) != tc.record {
				t.Errorf("rejected record %d %s, want 1 %s", re.Index, re.Raw, tc.record)
			}
			if len(b.Records) != 2 || !slices.Equal(index, []int{0, 2}) {
				t.Errorf("accepted %d records at %v, want the two others at [0 2]", len(b.Records), index)
			}
		})
	}

	t.Run("repeated key", func(t *testing.T) {
		_, _, rejected, err := wire.Decode([]byte("acme"), []byte(dupTotal))
		if err != nil || len(rejected) != 1 {
			t.Fatalf("Decode: %v %v", rejected, err)
		}
		want := fmt.Sprintf("records[1].total: key appears twice (again at offset %d); repeated keys are ambiguous (bad_json)",
			strings.LastIndex(dupTotal, `"total"`))
		if got := rejected[0].Err.Error(); got != want {
			t.Errorf("error\n got: %s\nwant: %s", got, want)
		}
	})
}

func TestDecodeAcceptsVariants(t *testing.T) {
	for _, tc := range []struct {
		name, record string
		check        func(wire.Record) bool
	}{
		{"integer total", rec(`"total":"5"`, `"total":5`),
			func(r wire.Record) bool { return r.Total.Equal(decimal.NewFromInt(5)) }},
		{"minus zero", rec(`"total":"5"`, `"total":"-0.0"`),
			func(r wire.Record) bool { return r.Total.IsZero() }},
		{"trailing zeros kept", rec(`"total":"5"`, `"total":"1.500000000000"`),
			func(r wire.Record) bool { return r.Total.String() == "1.5" && r.Total.Exponent() == -12 }},
		{"quantity null", rec(`"total":"5"`, `"total":"5","quantity":null`),
			func(r wire.Record) bool { return !r.Quantity.Valid }},
		{"quantity", rec(`"total":"5"`, `"total":"5","quantity":"0.25"`),
			func(r wire.Record) bool { return r.Quantity.Valid && r.Quantity.Decimal.String() == "0.25" }},
		{"final", rec(`"total":"5"`, `"total":"5","final":true`),
			func(r wire.Record) bool { return r.Final }},
		{"final null", rec(`"total":"5"`, `"total":"5","final":null`),
			func(r wire.Record) bool { return !r.Final }},
		{"zone offset", rec(`2026-12-02T09:59:58Z`, `2026-12-02T11:29:58.5+01:30`),
			func(r wire.Record) bool {
				return r.OccurredAt == time.Date(2026, 12, 2, 9, 59, 58, 5e8, time.UTC)
			}},
		{"lower-case t and z", rec(`2026-12-02T09:59:58Z`, `2026-12-02t09:59:58z`),
			func(r wire.Record) bool { return r.OccurredAt == time.Date(2026, 12, 2, 9, 59, 58, 0, time.UTC) }},
		// U+FFFD is a character like any other, spelled out or escaped;
		// only bytes that are not UTF-8 are refused.
		{"member holding U+FFFD", rec(`"total":"5"`, `"member":"caf\ufffd"`),
			func(r wire.Record) bool { return r.Member == "caf\uFFFD" }},
		{"member holding U+FFFD as bytes", rec(`"total":"5"`, "\"member\":\"caf\xef\xbf\xbd\""),
			func(r wire.Record) bool { return r.Member == "caf\uFFFD" }},
		{"leap day", rec(`2026-12-02T09:59:58Z`, `2028-02-29T00:00:00Z`),
			func(r wire.Record) bool { return r.OccurredAt.Month() == time.February }},
		{"upper-case UUID", rec(`01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a11`, `01938F2E-6C1B-7D4E-9A51-3C2F9B7E4A11`),
			func(r wire.Record) bool {
				return r.OperationID == uuid.MustParse("01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a11")
			}},
		{"escaped customer", rec(`"customer":"acme"`, `"customer":"\u0061cm\u0065"`),
			func(r wire.Record) bool { return r.Customer == "acme" }},
		{"escaped key", rec(`"total":"5"`, `"t\u006ftal":"7"`),
			func(r wire.Record) bool { return r.Total.String() == "7" }},
		{"whitespace", strings.ReplaceAll(strings.ReplaceAll(okRecord, `,"`, " ,\n\t\""), `":`, "\"\r\n: "),
			func(r wire.Record) bool { return r.Seq == 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, index, rejected, err := wire.Decode([]byte("acme"), []byte(message(tc.record)))
			if err != nil || len(rejected) > 0 {
				t.Fatalf("Decode: %v %v", err, rejected)
			}
			if len(b.Records) != 1 || index[0] != 0 || !tc.check(b.Records[0]) {
				t.Errorf("decoded %+v", b.Records)
			}
		})
	}
}

func TestDecodeProducer(t *testing.T) {
	value := edit(message(okRecord), `"gateway-eu-1"`, `"gateway z\u00fcrich \ud83d\ude80"`)
	b, _, _, err := wire.Decode([]byte("acme"), []byte(value))
	if err != nil {
		t.Fatal(err)
	}
	if b.Producer != "gateway zürich 🚀" {
		t.Errorf("Producer = %q", b.Producer)
	}
	long := strings.Repeat("ü", 128) // 256 bytes, 128 characters
	if _, _, _, err := wire.Decode([]byte("acme"), []byte(edit(message(okRecord), "gateway-eu-1", long))); err != nil {
		t.Errorf("128-character producer: %v", err)
	}
}

func TestDecodeKeepsOrderAndRaw(t *testing.T) {
	bad := rec(`"seq":1`, `"seq":0`)
	records := []string{okRecord, bad, rec(`"seq":1`, `"seq":2`), " " + bad + " ", rec(`"seq":1`, `"seq":3`)}
	value := "{\n\"records\" : [ " + strings.Join(records, " ,\n ") + " ] ," + edit(message(), `,"records":[]}`, `}`)[1:]
	buf := []byte(value)
	b, index, rejected, err := wire.Decode([]byte("acme"), buf)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for _, r := range b.Records {
		seqs = append(seqs, r.Seq)
	}
	if !slices.Equal(seqs, []int64{1, 2, 3}) || !slices.Equal(index, []int{0, 2, 4}) {
		t.Errorf("accepted seqs %v at %v, want [1 2 3] at [0 2 4]", seqs, index)
	}
	if len(rejected) != 2 || rejected[0].Index != 1 || rejected[1].Index != 3 {
		t.Fatalf("rejected %v", rejected)
	}
	for _, re := range rejected {
		if string(re.Raw) != bad {
			t.Errorf("Raw = %s, want %s", re.Raw, bad)
		}
	}
	// Raw is a copy: the Kafka client may reuse the message buffer.
	copy(buf, strings.Repeat("x", len(buf)))
	if string(rejected[0].Raw) != bad {
		t.Error("Raw shares memory with the message")
	}
}

func TestEncode(t *testing.T) {
	b := wire.Batch{
		Schema:   wire.Schema,
		BatchID:  uuid.MustParse("01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a10"),
		Producer: `gw "eu" \ 1`,
		Epoch:    3,
		SentAt:   time.Date(2026, 12, 2, 11, 0, 0, 120e6, time.FixedZone("CET", 3600)),
		Records: []wire.Record{{
			OperationID: uuid.MustParse("01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a11"),
			Customer:    "acme", Meter: "api_calls", Seq: 1,
			Total:      amount.MustParse("1.50"),
			Quantity:   decimal.NewNullDecimal(amount.MustParse("1.5")),
			OccurredAt: time.Date(2026, 12, 2, 9, 59, 58, 0, time.UTC),
			Final:      true,
		}},
	}
	got, err := wire.Encode(b)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"schema":"meter.batch.v1","batch_id":"01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a10","producer":"gw \"eu\" \\ 1","epoch":3,"sent_at":"2026-12-02T10:00:00.12Z","records":[{"operation_id":"01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a11","customer":"acme","meter":"api_calls","seq":1,"total":"1.50","quantity":"1.5","occurred_at":"2026-12-02T09:59:58Z","final":true}]}`
	if string(got) != want {
		t.Errorf("Encode\n got: %s\nwant: %s", got, want)
	}
}

func TestEncodeRefusesWhatDecodeRejects(t *testing.T) {
	b := wire.Batch{
		Producer: "gw\x00",
		Epoch:    0,
		SentAt:   time.Time{},
		Records: []wire.Record{
			{Customer: "acme", Meter: "api calls", Seq: 0, Total: decimal.RequireFromString("-1"),
				Quantity: decimal.NewNullDecimal(decimal.RequireFromString("0.0000000001")), OccurredAt: time.Now()},
			{OperationID: uuid.New(), Customer: "globex", Meter: "m", Seq: 1, Total: decimal.New(1, 40), OccurredAt: time.Now()},
		},
	}
	_, err := wire.Encode(b)
	want := strings.Join([]string{
		"schema: is missing; set it to wire.Schema (missing_field)",
		"batch_id: is the nil UUID (bad_uuid)",
		`producer: "gw\x00" has control character U+0000 at byte 2 (bad_id)`,
		"epoch: 0 is not positive; epochs start at 1 (bad_epoch)",
		`sent_at: "0001-01-01T00:00:00Z" is before 1970 (bad_timestamp)`,
		"records[0].operation_id: is the nil UUID (bad_uuid)",
		`records[0].meter: "api calls" has ' ' at byte 3; ids use only A-Z a-z 0-9 . _ : - (bad_id)`,
		"records[0].seq: 0 is below 1; seqs start at 1 (bad_seq)",
		`records[0].total: "-1" is negative; totals and quantities are never below zero (negative_value)`,
		`records[0].quantity: "0.0000000001" has more than 9 digits after the point (decimal_out_of_range)`,
		`records[1].customer: "globex" differs from records[0].customer "acme"; a message carries one customer's records (customer_mismatch)`,
		`records[1].total: "1000000000000000000000000000000000000000"... has more than 38 significant digits (decimal_out_of_range)`,
	}, "\n")
	if err == nil || err.Error() != want {
		t.Errorf("Encode error\n got: %v\nwant: %s", err, want)
	}
	var e *wire.Error
	if !errors.As(err, &e) || e.Reason != wire.ReasonMissingField {
		t.Errorf("errors.As(err, *wire.Error) = %v", e)
	}

	ok := genBatch(1, 1)
	ok.Records = nil
	if _, err := wire.Encode(ok); err == nil || !strings.Contains(err.Error(), "(empty_batch)") {
		t.Errorf("Encode of no records: %v", err)
	}
	big := genBatch(2, wire.MaxRecords)
	big.Records = append(big.Records, big.Records[0])
	if _, err := wire.Encode(big); err == nil || !strings.Contains(err.Error(), "(too_many_records)") {
		t.Errorf("Encode of %d records: %v", len(big.Records), err)
	}
	big = genBatch(3, wire.MaxRecords)
	for i := range big.Records {
		big.Records[i].Meter = strings.Repeat("m", 100)
	}
	if _, err := wire.Encode(big); err == nil || !strings.HasPrefix(err.Error(), "message is ") ||
		!strings.HasSuffix(err.Error(), "; split the batch (message_too_large)") {
		t.Errorf("Encode of a large batch: %v", err)
	}
}

func TestRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		want := batchGen.Draw(t, "batch")
		enc, err := wire.Encode(want)
		if err != nil {
			t.Fatalf("Encode: %v", err)
		}
		got, index, rejected, err := wire.Decode([]byte(want.Records[0].Customer), enc)
		if err != nil || len(rejected) > 0 {
			t.Fatalf("Decode(Encode(b)): %v %v\n%s", err, rejected, enc)
		}
		if d := diffBatch(want, got); d != "" {
			t.Fatalf("Decode(Encode(b)) differs: %s\n%s", d, enc)
		}
		for i, x := range index {
			if x != i {
				t.Fatalf("index = %v", index)
			}
		}
		again, err := wire.Encode(got)
		if err != nil || !bytes.Equal(again, enc) {
			t.Fatalf("Encode(Decode(Encode(b))) = %s, %v; want %s", again, err, enc)
		}
	})
}

// diffBatch describes how got differs from want ("" when it does not). Times
// must be equal instants in UTC; decimals equal in value and scale.
func diffBatch(want, got wire.Batch) string {
	if want.Schema != got.Schema || want.BatchID != got.BatchID || want.Producer != got.Producer || want.Epoch != got.Epoch {
		return fmt.Sprintf("header %+v, want %+v", got, want)
	}
	if d := diffTime(want.SentAt, got.SentAt); d != "" {
		return "sent_at: " + d
	}
	if len(want.Records) != len(got.Records) {
		return fmt.Sprintf("%d records, want %d", len(got.Records), len(want.Records))
	}
	for i, w := range want.Records {
		g := got.Records[i]
		if w.OperationID != g.OperationID || w.Customer != g.Customer || w.Meter != g.Meter || w.Seq != g.Seq ||
			w.Final != g.Final || w.Quantity.Valid != g.Quantity.Valid {
			return fmt.Sprintf("records[%d] = %+v, want %+v", i, g, w)
		}
		if d := diffDecimal(w.Total, g.Total); d != "" {
			return fmt.Sprintf("records[%d].total: %s", i, d)
		}
		if w.Quantity.Valid {
			if d := diffDecimal(w.Quantity.Decimal, g.Quantity.Decimal); d != "" {
				return fmt.Sprintf("records[%d].quantity: %s", i, d)
			}
		}
		if d := diffTime(w.OccurredAt, g.OccurredAt); d != "" {
			return fmt.Sprintf("records[%d].occurred_at: %s", i, d)
		}
	}
	return ""
}

func diffDecimal(want, got decimal.Decimal) string {
	if !want.Equal(got) || want.Exponent() != got.Exponent() {
		return fmt.Sprintf("%s (exp %d), want %s (exp %d)", got, got.Exponent(), want, want.Exponent())
	}
	return ""
}

func diffTime(want, got time.Time) string {
	if !want.Equal(got) || got.Location() != time.UTC || got != got.Round(0) {
		return fmt.Sprintf("%v, want %v in UTC", got, want)
	}
	return ""
}

// Generators of valid batches.
var (
	idGen       = rapid.StringMatching(`[A-Za-z0-9._:-]{1,128}`).Filter(func(s string) bool { return s != "." && s != ".." })
	producerGen = rapid.StringOfN(rapid.Rune().Filter(func(r rune) bool {
		return utf8.ValidRune(r) && !unicode.IsControl(r)
	}), 1, wire.MaxIDLen, -1)
	uuidGen = rapid.Custom(func(t *rapid.T) uuid.UUID {
		var u uuid.UUID
		copy(u[:], rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(t, "bytes"))
		if u == uuid.Nil {
			u[15] = 1
		}
		return u
	})
	decimalGen = rapid.Custom(func(t *rapid.T) decimal.Decimal {
		s := rapid.StringMatching(`(0|[1-9][0-9]{0,28})(\.[0-9]{1,9})?`).Draw(t, "decimal")
		return amount.MustParse(s)
	})
	timeGen = rapid.Custom(func(t *rapid.T) time.Time {
		lo, hi := wire.MinOccurredAt.Unix(), wire.MaxOccurredAt.Unix()-1
		sec := rapid.OneOf(rapid.Int64Range(lo, hi), rapid.Int64Range(1.7e9, 1.9e9)).Draw(t, "sec")
		nsec := rapid.OneOf(rapid.Just(int64(0)), rapid.Int64Range(0, 999), rapid.Int64Range(0, 1e9-1)).Draw(t, "nsec")
		return time.Unix(sec, nsec).UTC()
	})
	positive = rapid.OneOf(rapid.Int64Range(1, 100), rapid.Int64Range(1, math.MaxInt64))
	batchGen = rapid.Custom(func(t *rapid.T) wire.Batch {
		customer := idGen.Draw(t, "customer")
		b := wire.Batch{
			Schema:   wire.Schema,
			BatchID:  uuidGen.Draw(t, "batch_id"),
			Producer: producerGen.Draw(t, "producer"),
			Epoch:    positive.Draw(t, "epoch"),
			SentAt:   timeGen.Draw(t, "sent_at"),
		}
		n := rapid.IntRange(1, 20).Draw(t, "records")
		for range n {
			r := wire.Record{
				OperationID: uuidGen.Draw(t, "operation_id"),
				Customer:    customer,
				Meter:       idGen.Draw(t, "meter"),
				Seq:         positive.Draw(t, "seq"),
				Total:       decimalGen.Draw(t, "total"),
				OccurredAt:  timeGen.Draw(t, "occurred_at"),
				Final:       rapid.Bool().Draw(t, "final"),
			}
			if rapid.Bool().Draw(t, "has quantity") {
				r.Quantity = decimal.NewNullDecimal(decimalGen.Draw(t, "quantity"))
			}
			b.Records = append(b.Records, r)
		}
		return b
	})
)

// genBatch returns a deterministic valid batch of customer "acme" with n
// records, shaped like a gateway's: a few meters, quantities, recent times.
func genBatch(seed uint64, n int) wire.Batch {
	meters := []string{"api_calls", "egress_bytes", "storage.gb-hours", "jobs:gpu-seconds"}
	base := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	id := func(i uint64) uuid.UUID {
		var u uuid.UUID
		for j := range u {
			u[j] = byte((seed*0x9e3779b97f4a7c15 + i*0xbf58476d1ce4e5b9) >> (j % 8 * 8))
		}
		u[0] = byte(i >> 8)
		u[1] = byte(i)
		u[6] = u[6]&0x0f | 0x70
		return u
	}
	b := wire.Batch{Schema: wire.Schema, BatchID: id(1 << 20), Producer: "gateway-eu-1", Epoch: 3, SentAt: base.Add(time.Hour)}
	for i := range n {
		q := decimal.New(int64(i%97+1), -int32(i%4))
		b.Records = append(b.Records, wire.Record{
			OperationID: id(uint64(i)),
			Customer:    "acme",
			Meter:       meters[i%len(meters)],
			Seq:         int64(1000 + i/len(meters)),
			Total:       decimal.New(int64(1234567+i*101), -int32(i%4)),
			Quantity:    decimal.NewNullDecimal(q),
			OccurredAt:  base.Add(time.Duration(i) * 3517 * time.Millisecond),
		})
	}
	return b
}

// BenchmarkDecode decodes a 1,000-record message, the size the ingest
// benchmark sends, and a message of about 1 MiB, the largest allowed
// (10,000 realistic records do not fit in 1 MiB); it reports the time per
// record.
func BenchmarkDecode(b *testing.B) {
	sample, err := wire.Encode(genBatch(7, 100))
	if err != nil {
		b.Fatal(err)
	}
	full := wire.MaxMessageBytes / (len(sample) / 100) * 97 / 100
	for _, n := range []int{1000, full} {
		value, err := wire.Encode(genBatch(7, n))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			b.SetBytes(int64(len(value)))
			b.ReportAllocs()
			for b.Loop() {
				batch, _, rejected, err := wire.Decode([]byte("acme"), value)
				if err != nil || len(rejected) > 0 || len(batch.Records) != n {
					b.Fatal(err, rejected)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/record")
		})
	}
}

func BenchmarkEncode(b *testing.B) {
	batch := genBatch(7, 1000)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := wire.Encode(batch); err != nil {
			b.Fatal(err)
		}
	}
}

// An error's detail is stored as text (dead_letters.detail): whatever bytes
// the message held, it is valid UTF-8 without NUL. A raw token cut at the
// length shown once split a character, and Postgres refused the dead
// letter, and with it the message's valid records.
func TestErrorDetailsAreText(t *testing.T) {
	long := strings.Repeat("é", 25)
	for _, bad := range []string{long + `\ud800`, long + "\xff" + `\ud800`, "\xff\xfe", strings.Repeat("€", 30) + `\udc00`} {
		value := `{"schema":"meter.batch.v1","batch_id":"52621be3-ac96-48a4-a0b0-88274452c911","producer":"pe","epoch":1,` +
			`"sent_at":"2026-12-07T03:17:58Z","records":[` +
			`{"operation_id":"0779c313-8062-4bae-949a-150520458b4e","customer":"e2","meter":"only","seq":1,"total":"42","occurred_at":"2026-12-07T03:17:58Z"},` +
			`{"operation_id":"8fe27486-6415-490f-a2c0-86078275a77b","customer":"e2","meter":"` + bad + `","seq":1,"total":"1","occurred_at":"2026-12-07T03:17:58Z"}]}`
		b, _, rejected, err := wire.Decode([]byte("e2"), []byte(value))
		var details []string
		if err != nil {
			var e *wire.Error
			if errors.As(err, &e) {
				details = append(details, e.Detail)
			}
		}
		for _, r := range rejected {
			details = append(details, r.Err.Detail)
		}
		if len(details) == 0 {
			t.Errorf("%q: accepted", bad)
		}
		for _, d := range details {
			if !utf8.ValidString(d) || strings.ContainsRune(d, 0) {
				t.Errorf("%q: detail %q is not text", bad, d)
			}
		}
		if err == nil && len(b.Records) != 1 {
			t.Errorf("%q: %d records accepted, want the valid one", bad, len(b.Records))
		}
	}
}
