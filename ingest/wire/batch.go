package wire

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/amount"
)

// Schema is the value of the "schema" field of every message this package reads and writes.
const Schema = "meter.batch.v1"

// Limits of a message (docs/design.md §2).
const (
	MaxMessageBytes = 1 << 20 // a message value is at most 1 MiB
	MaxRecords      = 10000   // and carries at most this many records
	MaxIDLen        = 128     // producer, customer and meter ids are 1..MaxIDLen characters
)

// Timestamps outside [minTime, maxTime) are refused: the zero time.Time
// (year 1) is a forgotten field, not usage, and years past 9999 have no
// RFC 3339 form.
var (
	minTime = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	maxTime = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
)

// Usage is booked in its customer's period of occurred_at, whose name (its
// local start date) must be one a period reference can name, 1970-01-01
// to 9998-12-31 (periods.MinRefDate, MaxRefDate), or no one could read or
// close it. An instant in [MinOccurredAt, MaxOccurredAt) is: its local date
// in any zone (UTC−12 to UTC+14) is 1970-02-01 or later, so the period of
// any calendar (daily, weekly, monthly at any anchor day and time) starts
// in 1970 or later; and on 9998-12-01 or earlier, so it starts by then.
var (
	MinOccurredAt = time.Date(1970, 2, 2, 0, 0, 0, 0, time.UTC)
	MaxOccurredAt = time.Date(9998, 12, 1, 0, 0, 0, 0, time.UTC)
)

// Batch is one meter.batch.v1 message. All its records belong to the customer
// named by the message key.
type Batch struct {
	Schema   string    `json:"schema"`
	BatchID  uuid.UUID `json:"batch_id"`
	Producer string    `json:"producer"`
	Epoch    int64     `json:"epoch"`
	SentAt   time.Time `json:"sent_at"`
	Records  []Record  `json:"records"`

	// spans[i] is where Records[i] lies in the message Decode read.
	spans [][2]int
}

// RecordBytes returns a copy of the exact JSON of Records[i] in value, the
// message b was decoded from, or nil when b was not made by Decode.
func (b *Batch) RecordBytes(value []byte, i int) []byte {
	if i < 0 || i >= len(b.spans) || b.spans[i][1] > len(value) {
		return nil
	}
	return bytes.Clone(value[b.spans[i][0]:b.spans[i][1]])
}

// Record is one usage report: the running total of the stream
// (producer, epoch, customer, meter) through Seq.
type Record struct {
	OperationID uuid.UUID           `json:"operation_id"`
	Customer    string              `json:"customer"`
	Meter       string              `json:"meter"`
	Seq         int64               `json:"seq"`
	Total       decimal.Decimal     `json:"total"`    // encoded as a JSON string
	Quantity    decimal.NullDecimal `json:"quantity"` // optional; encoded as a string, omitted when not Valid
	OccurredAt  time.Time           `json:"occurred_at"`
	Final       bool                `json:"final,omitempty"`
	// Level, when Valid, makes this a gauge record: it carries the level
	// instead of a total (docs/design.md §16).
	Level decimal.NullDecimal `json:"level"`
	// Member, when not empty, makes this a unique record: it carries the
	// member instead of a total.
	Member string `json:"member,omitempty"`
}

// Shape is what the record carries: "counter" (a total), "gauge" (a
// level) or "unique" (a member).
func (r Record) Shape() string {
	switch {
	case r.Level.Valid:
		return "gauge"
	case r.Member != "":
		return "unique"
	}
	return "counter"
}

// Encode writes b as meter.batch.v1 JSON: decimals as strings keeping their
// digits after the point ("1.50" stays "1.50"), times in RFC 3339 UTC with
// as many fractional digits as needed.
//
// Encode refuses a batch that Decode would reject in whole or in part, so a
// producer learns of bad input before it is sent. The error joins one *Error
// per problem (errors.Join); the message key is not known here, so Encode
// checks instead that all records name the same customer.
//
// For a batch b that Encode accepts, Decode(customer, Encode(b)) returns b with
// its times in UTC (without monotonic clock readings) and its decimals equal in
// value and scale.
func Encode(b Batch) ([]byte, error) {
	if errs := b.problems(); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	buf := make([]byte, 0, 160+220*len(b.Records))
	buf = append(buf, `{"schema":`...)
	buf = appendString(buf, b.Schema)
	buf = append(buf, `,"batch_id":"`...)
	buf = appendUUID(buf, b.BatchID)
	buf = append(buf, `","producer":`...)
	buf = appendString(buf, b.Producer)
	buf = append(buf, `,"epoch":`...)
	buf = strconv.AppendInt(buf, b.Epoch, 10)
	buf = append(buf, `,"sent_at":"`...)
	buf = b.SentAt.UTC().AppendFormat(buf, time.RFC3339Nano)
	buf = append(buf, `","records":[`...)
	for i, r := range b.Records {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, `{"operation_id":"`...)
		buf = appendUUID(buf, r.OperationID)
		buf = append(buf, `","customer":`...)
		buf = appendString(buf, r.Customer)
		buf = append(buf, `,"meter":`...)
		buf = appendString(buf, r.Meter)
		buf = append(buf, `,"seq":`...)
		buf = strconv.AppendInt(buf, r.Seq, 10)
		switch {
		case r.Level.Valid:
			buf = append(buf, `,"level":`...)
			buf = appendDecimal(buf, r.Level.Decimal)
		case r.Member != "":
			buf = append(buf, `,"member":`...)
			buf = appendString(buf, r.Member)
		default:
			buf = append(buf, `,"total":`...)
			buf = appendDecimal(buf, r.Total)
		}
		if r.Quantity.Valid {
			buf = append(buf, `,"quantity":`...)
			buf = appendDecimal(buf, r.Quantity.Decimal)
		}
		buf = append(buf, `,"occurred_at":"`...)
		buf = r.OccurredAt.UTC().AppendFormat(buf, time.RFC3339Nano)
		buf = append(buf, '"')
		if r.Final {
			buf = append(buf, `,"final":true`...)
		}
		buf = append(buf, '}')
	}
	buf = append(buf, "]}"...)
	if len(buf) > MaxMessageBytes {
		return nil, &Error{Reason: ReasonMessageTooLarge, Detail: tooLarge(len(buf)) + "; split the batch"}
	}
	return buf, nil
}

// problems applies Decode's rules to a typed batch.
func (b Batch) problems() []error {
	var errs []error
	add := func(r Reason, field, detail string) {
		errs = append(errs, &Error{Reason: r, Field: field, Detail: detail})
	}
	switch {
	case b.Schema == "":
		add(ReasonMissingField, "schema", "is missing; set it to wire.Schema")
	case b.Schema != Schema:
		add(ReasonUnknownSchema, "schema", unknownSchema(b.Schema))
	}
	if b.BatchID == uuid.Nil {
		add(ReasonBadUUID, "batch_id", "is the nil UUID")
	}
	if p := producerProblem(b.Producer); p != "" {
		add(ReasonBadID, "producer", p)
	}
	if b.Epoch < 1 {
		add(ReasonBadEpoch, "epoch", strconv.FormatInt(b.Epoch, 10)+" is not positive; epochs start at 1")
	}
	if p := timeRangeProblem(b.SentAt); p != "" {
		add(ReasonBadTimestamp, "sent_at", quote(b.SentAt.UTC().Format(time.RFC3339Nano))+p)
	}
	switch n := len(b.Records); {
	case n == 0:
		add(ReasonEmptyBatch, "records", emptyBatch)
	case n > MaxRecords:
		add(ReasonTooManyRecords, "records", tooMany(n))
	}
	for i, r := range b.Records {
		if r.OperationID == uuid.Nil {
			add(ReasonBadUUID, recordPath(i, "operation_id"), "is the nil UUID")
		}
		if p := idProblem(r.Customer); p != "" {
			add(ReasonBadID, recordPath(i, "customer"), p)
		} else if c := b.Records[0].Customer; r.Customer != c {
			add(ReasonCustomerMismatch, recordPath(i, "customer"),
				quote(r.Customer)+" differs from records[0].customer "+quote(c)+"; a message carries one customer's records")
		}
		if p := idProblem(r.Meter); p != "" {
			add(ReasonBadID, recordPath(i, "meter"), p)
		}
		if r.Seq < 1 {
			add(ReasonBadSeq, recordPath(i, "seq"), seqBelowOne(strconv.FormatInt(r.Seq, 10)))
		}
		switch {
		case r.Level.Valid && r.Member != "":
			add(ReasonMixedShape, recordPath(i, "member"), mixedShape)
		case r.Level.Valid:
			if reason, p := decimalProblem(r.Level.Decimal); p != "" {
				add(reason, recordPath(i, "level"), p)
			}
		case r.Member != "":
			if p := memberProblem(r.Member); p != "" {
				add(ReasonBadMember, recordPath(i, "member"), p)
			}
		default:
			if reason, p := decimalProblem(r.Total); p != "" {
				add(reason, recordPath(i, "total"), p)
			}
		}
		if r.Quantity.Valid && r.Shape() != "counter" {
			add(ReasonMixedShape, recordPath(i, "quantity"), "is a counter's field; a "+r.Shape()+" record carries no quantity")
		}
		if r.Quantity.Valid {
			if reason, p := decimalProblem(r.Quantity.Decimal); p != "" {
				add(reason, recordPath(i, "quantity"), p)
			}
		}
		if p := occurredRangeProblem(r.OccurredAt); p != "" {
			add(ReasonBadTimestamp, recordPath(i, "occurred_at"), quote(r.OccurredAt.UTC().Format(time.RFC3339Nano))+p)
		}
	}
	return errs
}

// Rule checks shared by Encode and Decode. Each returns "" when the value is
// fine, else the Detail of an Error.

// idProblem checks a customer or meter id (or a message key): 1..MaxIDLen
// characters of [A-Za-z0-9._:-], not "." or ".." (internal/ids).
func idProblem[T string | []byte](s T) string {
	if len(s) == 0 {
		return "is empty; ids are 1 to 128 characters of A-Z a-z 0-9 . _ : -"
	}
	if string(s) == "." || string(s) == ".." {
		return quote(string(s)) + " is a path segment; ids are 1 to 128 characters of A-Z a-z 0-9 . _ : -, not . or .."
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !idByte[c] {
			shown := quote(string(s))
			if c < utf8.RuneSelf {
				return fmt.Sprintf("%s has %q at byte %d; ids use only A-Z a-z 0-9 . _ : -", shown, rune(c), i)
			}
			r, _ := utf8.DecodeRuneInString(string(s[i:]))
			if r == utf8.RuneError {
				return fmt.Sprintf("%s has invalid UTF-8 at byte %d; ids use only A-Z a-z 0-9 . _ : -", shown, i)
			}
			return fmt.Sprintf("%s has %q at byte %d; ids use only A-Z a-z 0-9 . _ : -", shown, r, i)
		}
	}
	if len(s) > MaxIDLen {
		return fmt.Sprintf("%s is %d characters long; at most %d", quote(string(s)), len(s), MaxIDLen)
	}
	return ""
}

var idByte = func() (t [256]bool) {
	for c := 0; c < 256; c++ {
		t[c] = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == ':' || c == '-'
	}
	return t
}()

// producerProblem checks a producer id: 1..MaxIDLen characters of valid
// UTF-8 without control characters.
func producerProblem[T string | []byte](s T) string {
	if len(s) == 0 {
		return "is empty; producer ids are 1 to 128 characters"
	}
	n := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c < 0x7f { // fast path: printable ASCII
			i++
			n++
			continue
		}
		r, size := utf8.DecodeRuneInString(string(s[i:min(i+utf8.UTFMax, len(s))]))
		if r == utf8.RuneError && size <= 1 {
			return fmt.Sprintf("%s has invalid UTF-8 at byte %d", quote(string(s)), i)
		}
		if unicode.IsControl(r) {
			return fmt.Sprintf("%s has control character %U at byte %d", quote(string(s)), r, i)
		}
		i += size
		n++
	}
	if n > MaxIDLen {
		return fmt.Sprintf("%s is %d characters long; at most %d", quote(string(s)), n, MaxIDLen)
	}
	return ""
}

// decimalProblem checks a total or quantity: amount's limits and >= 0.
func decimalProblem(d decimal.Decimal) (Reason, string) {
	if err := amount.Check(d); err != nil {
		return ReasonDecimalOutOfRange, quote(d.String()) + " has " + err.Error()
	}
	if d.Sign() < 0 {
		return ReasonNegative, negative(d.String())
	}
	return "", ""
}

// timeRangeProblem checks that t lies in years 1970..9999 (UTC).
func timeRangeProblem(t time.Time) string {
	switch {
	case t.Before(minTime):
		return " is before 1970"
	case !t.Before(maxTime):
		return " is after 9999"
	}
	return ""
}

// occurredRangeProblem checks that t lies in [MinOccurredAt, MaxOccurredAt).
func occurredRangeProblem(t time.Time) string {
	switch {
	case t.Before(MinOccurredAt):
		return " is before 1970-02-02, from which every calendar's period of it is one Tally keeps"
	case !t.Before(MaxOccurredAt):
		return " is not before 9998-12-01, until which every calendar's period of it is one Tally keeps"
	}
	return ""
}

func unknownSchema(s string) string {
	return quote(s) + " is not a schema this decoder reads; want " + strconv.Quote(Schema)
}

func negative(s string) string {
	return quote(s) + " is negative; totals and quantities are never below zero"
}

func seqBelowOne(s string) string { return s + " is below 1; seqs start at 1" }

func tooLarge(n int) string {
	return fmt.Sprintf("message is %d bytes; at most %d (1 MiB)", n, MaxMessageBytes)
}

func tooMany(n int) string {
	return fmt.Sprintf("has %d records; at most %d per message", n, MaxRecords)
}

const emptyBatch = "is empty; a message carries 1 to 10000 records"

func appendUUID(buf []byte, u uuid.UUID) []byte {
	var s [36]byte // u.String() would allocate
	const hex = "0123456789abcdef"
	j := 0
	for i, c := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			s[j] = '-'
			j++
		}
		s[j], s[j+1] = hex[c>>4], hex[c&0xf]
		j += 2
	}
	return append(buf, s[:]...)
}

// appendDecimal writes d as a JSON string. Digits after the point are kept
// ("1.50"), so a decoded value re-encodes to the text it came from, unless
// that text would exceed the 80 characters amount.Parse accepts.
func appendDecimal(buf []byte, d decimal.Decimal) []byte {
	var s string
	if e := d.Exponent(); e < 0 {
		s = d.StringFixed(-e)
		if len(s) > 80 {
			s = d.String()
		}
	} else {
		s = d.String()
	}
	buf = append(buf, '"')
	buf = append(buf, s...)
	return append(buf, '"')
}

// appendString writes s as a JSON string. Only '"', '\' and control bytes
// need escapes; s is valid UTF-8 (checked before).
func appendString(buf []byte, s string) []byte {
	const hex = "0123456789abcdef"
	buf = append(buf, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		buf = append(buf, s[start:i]...)
		switch c {
		case '"', '\\':
			buf = append(buf, '\\', c)
		default:
			buf = append(buf, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	buf = append(buf, s[start:]...)
	return append(buf, '"')
}
