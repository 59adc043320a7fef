package wire

import (
	"strconv"
	"strings"
)

// Reason is a stable, machine-readable rejection code. It is stored with dead
// letters and used as a metric label, so a value never changes meaning once
// released; new problems get new reasons.
type Reason string

// Rejection reasons. Message-level and record-level problems share the codes:
// whether the message or only one record is rejected depends on where the
// problem is (see Decode).
const (
	ReasonBadJSON           Reason = "bad_json"             // not JSON, not an object, or a repeated key
	ReasonUnknownSchema     Reason = "unknown_schema"       // schema is not "meter.batch.v1"
	ReasonMissingField      Reason = "missing_field"        // a required field is absent
	ReasonWrongType         Reason = "wrong_type"           // a field has the wrong JSON type
	ReasonUnknownField      Reason = "unknown_field"        // a field meter.batch.v1 does not define
	ReasonBadUUID           Reason = "bad_uuid"             // batch_id or operation_id is not a canonical, non-nil UUID
	ReasonBadID             Reason = "bad_id"               // producer, customer or meter is not a valid id
	ReasonBadEpoch          Reason = "bad_epoch"            // epoch is not a positive integer
	ReasonBadSeq            Reason = "bad_seq"              // seq is not an integer >= 1
	ReasonBadDecimal        Reason = "bad_decimal"          // total or quantity is not a plain decimal
	ReasonDecimalOutOfRange Reason = "decimal_out_of_range" // more than 38 significant or 9 fractional digits
	ReasonNegative          Reason = "negative_value"       // total or quantity below zero
	ReasonBadTimestamp      Reason = "bad_timestamp"        // not RFC 3339 with a zone, or outside years 1970–9999
	ReasonCustomerMismatch  Reason = "customer_mismatch"    // record customer is not the message key
	ReasonTooManyRecords    Reason = "too_many_records"     // more than MaxRecords records
	ReasonMessageTooLarge   Reason = "message_too_large"    // more than MaxMessageBytes bytes
	ReasonEmptyBatch        Reason = "empty_batch"          // no records
	ReasonBadKey            Reason = "bad_key"              // the message key is not a customer id
	ReasonMixedShape        Reason = "mixed_record_shape"   // a record carries more than one of total, level and member
	ReasonBadMember         Reason = "bad_member"           // a member is not 1-256 characters of printable UTF-8
)

// Reasons returns every Reason in a stable order, for pre-registering metric
// labels and for tests that want one example of each.
func Reasons() []Reason {
	return []Reason{
		ReasonBadJSON, ReasonUnknownSchema, ReasonMissingField, ReasonWrongType,
		ReasonUnknownField, ReasonBadUUID, ReasonBadID, ReasonBadEpoch, ReasonBadSeq,
		ReasonBadDecimal, ReasonDecimalOutOfRange, ReasonNegative, ReasonBadTimestamp,
		ReasonCustomerMismatch, ReasonTooManyRecords, ReasonMessageTooLarge,
		ReasonEmptyBatch, ReasonBadKey, ReasonMixedShape, ReasonBadMember,
	}
}

// Error is one problem with a message or a record.
type Error struct {
	Reason Reason
	// Field is the JSON path of the offending value, such as "batch_id" or
	// "records[3].total"; empty when the problem is the message as a whole
	// (its size, its key, its JSON syntax).
	Field string
	// Detail is for people: it names the bad value (clipped) and the rule.
	Detail string
}

// Error reads like `records[3].total: "1e5" is not a decimal number (bad_decimal)`.
func (e Error) Error() string {
	if e.Field == "" {
		return e.Detail + " (" + string(e.Reason) + ")"
	}
	return e.Field + ": " + e.Detail + " (" + string(e.Reason) + ")"
}

// RecordError rejects one record of a message; the message's other records
// still count.
type RecordError struct {
	Index int    // position of the record in the message's records array
	Raw   []byte // the record's exact JSON bytes (a copy, safe to keep)
	Err   Error
}

func (e RecordError) Error() string { return e.Err.Error() }

// recordPath returns "records[i]" or "records[i].name".
func recordPath(i int, name string) string {
	p := "records[" + strconv.Itoa(i) + "]"
	if name == "" {
		return p
	}
	return p + memberPath(name)
}

// memberPath renders a key as a path step: ".total", or `["odd key"]` when
// the key is not a plain identifier.
func memberPath(name string) string {
	plain := name != ""
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			plain = false
			break
		}
	}
	if plain {
		return "." + name
	}
	return "[" + quote(name) + "]"
}

// maxShown is how many bytes of a bad value an error message quotes.
const maxShown = 40

// quote quotes s for an error message, clipped at a rune boundary.
func quote(s string) string {
	c, clipped := cutShown(s)
	if clipped {
		return strconv.Quote(c) + "..."
	}
	return strconv.Quote(c)
}

// clipRaw shows raw JSON text (a number, a literal, a string token) in an
// error message, which is stored as text (Text), clipped at a rune
// boundary.
func clipRaw(b []byte) string {
	c, clipped := cutShown(string(b))
	if clipped {
		return Text(c) + "..."
	}
	return Text(c)
}

// cutShown cuts s to at most maxShown bytes, between UTF-8 sequences, and says
// whether it cut.
func cutShown(s string) (string, bool) {
	if len(s) <= maxShown {
		return s, false
	}
	n := maxShown
	for n > 0 && s[n]&0xC0 == 0x80 { // do not cut a UTF-8 sequence
		n--
	}
	return s[:n], true
}

// Text makes s storable as Postgres text, as an error's Detail is stored
// (dead_letters.detail), whatever bytes it quotes from a message: invalid
// UTF-8 as U+FFFD, NUL escaped. Text refused by Postgres would fail the
// micro-batch, and the message's valid records with it.
func Text(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", `\u0000`)
}
