package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/amount"
)

// Decode parses and validates one Kafka message: key is the message key (the
// customer id), value the meter.batch.v1 JSON.
//
// On a message-level problem (size, key, JSON syntax, schema, a top-level
// field, the number of records) it returns a non-nil *Error and nothing else.
//
// Otherwise it returns the batch with only its valid records, in their
// original order; index[i] is the position in the message's records array of
// b.Records[i]; and one RecordError per rejected record, in order. Every record
// of the message is in exactly one of the two:
// len(b.Records)+len(rejected) is the number of records sent. A message whose
// records are all rejected yields an empty b.Records and a nil error.
//
// Each rejected record is reported with its first problem, checking in this
// order: JSON type, repeated or unknown keys (document order), then
// operation_id, customer (and customer_mismatch), meter, seq, total,
// quantity, occurred_at, final.
//
// Decode does not check occurred_at against the clock (future_timestamp):
// that needs the ingest time and belongs to the ledger.
func Decode(key, value []byte) (b Batch, index []int, rejected []RecordError, err error) {
	if len(value) > MaxMessageBytes {
		return fail(ReasonMessageTooLarge, "", tooLarge(len(value)))
	}
	if p := idProblem(key); p != "" {
		return fail(ReasonBadKey, "", "message key "+p)
	}
	if !json.Valid(value) {
		return fail(ReasonBadJSON, "", syntaxDetail(value))
	}
	// From here on value is known to be valid JSON, which keeps the scanner
	// below simple: it never meets a syntax error.
	start := skipSpace(value, 0)
	if value[start] != '{' {
		return fail(ReasonBadJSON, "", "message must be a JSON object, got "+kind(value[start:]))
	}

	var top [nTop]member
	var unknown []byte
	haveUnknown := false
	it := members{d: value, i: start + 1}
	for {
		m, ok := it.next()
		if !ok {
			break
		}
		f := topField(m.name())
		if f < 0 {
			if !haveUnknown {
				unknown, haveUnknown = m.name(), true
			}
			continue
		}
		if top[f].val != nil {
			return fail(ReasonBadJSON, topNames[f], repeated(m.keyAt))
		}
		top[f] = m
	}

	// The schema comes first: a message of another schema is reported as
	// such, not by whichever of its fields this decoder cannot read.
	schema, p := stringField(top[fSchema].val, ReasonUnknownSchema)
	if p.ok() && string(schema) != Schema {
		p = problem{ReasonUnknownSchema, unknownSchema(string(schema))}
	}
	if !p.ok() {
		return fail(p.reason, "schema", p.detail)
	}
	if haveUnknown {
		path := memberPath(string(unknown))
		if path[0] == '.' {
			path = path[1:]
		}
		return fail(ReasonUnknownField, path, "is not a meter.batch.v1 field; a batch has "+topList)
	}

	b.Schema = Schema
	if b.BatchID, p = parseUUID(top[fBatchID].val); !p.ok() {
		return fail(p.reason, "batch_id", p.detail)
	}
	producer, p := stringField(top[fProducer].val, ReasonBadID)
	if p.ok() {
		if d := producerProblem(producer); d != "" {
			p = problem{ReasonBadID, d}
		}
	}
	if !p.ok() {
		return fail(p.reason, "producer", p.detail)
	}
	b.Producer = string(producer)
	if b.Epoch, p = parseInt(top[fEpoch].val, ReasonBadEpoch); !p.ok() {
		return fail(p.reason, "epoch", p.detail)
	}
	if b.SentAt, p = parseTime(top[fSentAt].val); !p.ok() {
		return fail(p.reason, "sent_at", p.detail)
	}

	raw := top[fRecords].val
	switch {
	case raw == nil:
		return fail(ReasonMissingField, "records", missing)
	case raw[0] != '[':
		return fail(ReasonWrongType, "records", mustBe("an array", raw))
	}
	recordsAt := top[fRecords].at
	n := 0
	for el := (elems{d: value, i: recordsAt + 1}); ; n++ {
		if _, _, ok := el.next(); !ok {
			break
		}
	}
	switch {
	case n == 0:
		return fail(ReasonEmptyBatch, "records", emptyBatch)
	case n > MaxRecords:
		return fail(ReasonTooManyRecords, "records", tooMany(n))
	}

	d := decoder{data: value, key: key, keyStr: string(key)}
	b.Records = make([]Record, 0, n)
	b.spans = make([][2]int, 0, n)
	index = make([]int, 0, n)
	pos := recordsAt + 1
	for i := 0; i < n; i++ {
		pos = skipSpace(value, pos)
		if value[pos] == ',' {
			pos = skipSpace(value, pos+1)
		}
		r, end, field, p := d.record(pos)
		if end < 0 { // record stopped early; find the end of its JSON
			end = endValue(value, pos)
		}
		if p.ok() {
			b.Records = append(b.Records, r)
			b.spans = append(b.spans, [2]int{pos, end})
			index = append(index, i)
		} else {
			rejected = append(rejected, RecordError{
				Index: i,
				Raw:   bytes.Clone(value[pos:end]),
				Err:   Error{Reason: p.reason, Field: recordPath(i, field), Detail: p.detail},
			})
		}
		pos = end
	}
	return b, index, rejected, nil
}

func fail(r Reason, field, detail string) (Batch, []int, []RecordError, error) {
	return Batch{}, nil, nil, &Error{Reason: r, Field: field, Detail: detail}
}

// problem is an Error without its field path; the zero value means none.
type problem struct {
	reason Reason
	detail string
}

func (p problem) ok() bool { return p.reason == "" }

// decoder holds what the records of one message share.
type decoder struct {
	data   []byte
	key    []byte
	keyStr string            // every accepted Record.Customer shares this string
	meters map[string]string // meter ids seen, so a message allocates each once
}

// Top-level fields.
const (
	fSchema = iota
	fBatchID
	fProducer
	fEpoch
	fSentAt
	fRecords
	nTop
)

var topNames = [nTop]string{"schema", "batch_id", "producer", "epoch", "sent_at", "records"}

const topList = "schema, batch_id, producer, epoch, sent_at, records"

func topField(name []byte) int {
	switch string(name) {
	case "schema":
		return fSchema
	case "batch_id":
		return fBatchID
	case "producer":
		return fProducer
	case "epoch":
		return fEpoch
	case "sent_at":
		return fSentAt
	case "records":
		return fRecords
	}
	return -1
}

// Record fields.
const (
	rOperationID = iota
	rCustomer
	rMeter
	rSeq
	rTotal
	rQuantity
	rOccurredAt
	rFinal
	nRec
)

var recNames = [nRec]string{"operation_id", "customer", "meter", "seq", "total", "quantity", "occurred_at", "final"}

const recList = "operation_id, customer, meter, seq, total, quantity, occurred_at, final"

func recField(name []byte) int {
	switch string(name) {
	case "operation_id":
		return rOperationID
	case "customer":
		return rCustomer
	case "meter":
		return rMeter
	case "seq":
		return rSeq
	case "total":
		return rTotal
	case "quantity":
		return rQuantity
	case "occurred_at":
		return rOccurredAt
	case "final":
		return rFinal
	}
	return -1
}

// record decodes the record whose JSON starts at offset at of the message.
// It returns the offset just past the record, or -1 if it stopped before
// reaching it; and on a problem, the offending field's name ("" for the
// record as a whole).
func (d *decoder) record(at int) (r Record, end int, field string, p problem) {
	if d.data[at] != '{' {
		return r, -1, "", problem{ReasonWrongType, mustBe("an object", d.data[at:endValue(d.data, at)])}
	}
	var f [nRec][]byte
	it := members{d: d.data, i: at + 1}
	for {
		m, ok := it.next()
		if !ok {
			break
		}
		k := recField(m.name())
		if k < 0 {
			return r, -1, string(m.name()), problem{ReasonUnknownField, "is not a meter.batch.v1 record field; records have " + recList}
		}
		if f[k] != nil {
			return r, -1, recNames[k], problem{ReasonBadJSON, repeated(m.keyAt)}
		}
		f[k] = m.val
	}
	end = it.i
	field, p = d.fields(&r, &f)
	return r, end, field, p
}

// fields decodes and checks the members of a record in the documented order.
func (d *decoder) fields(r *Record, f *[nRec][]byte) (field string, p problem) {
	if r.OperationID, p = parseUUID(f[rOperationID]); !p.ok() {
		return "operation_id", p
	}

	customer, p := stringField(f[rCustomer], ReasonBadID)
	if p.ok() {
		if detail := idProblem(customer); detail != "" {
			p = problem{ReasonBadID, detail}
		} else if !bytes.Equal(customer, d.key) {
			p = problem{ReasonCustomerMismatch, quote(string(customer)) + " is not the message key " +
				quote(d.keyStr) + "; a message carries only its key's customer"}
		}
	}
	if !p.ok() {
		return "customer", p
	}
	r.Customer = d.keyStr

	meter, p := stringField(f[rMeter], ReasonBadID)
	if p.ok() {
		if detail := idProblem(meter); detail != "" {
			p = problem{ReasonBadID, detail}
		}
	}
	if !p.ok() {
		return "meter", p
	}
	r.Meter = d.intern(meter)

	if r.Seq, p = parseInt(f[rSeq], ReasonBadSeq); !p.ok() {
		return "seq", p
	}
	if r.Total, p = parseDecimal(f[rTotal]); !p.ok() {
		return "total", p
	}
	if q := f[rQuantity]; q != nil && !isNull(q) {
		if r.Quantity.Decimal, p = parseDecimal(q); !p.ok() {
			return "quantity", p
		}
		r.Quantity.Valid = true
	}
	if r.OccurredAt, p = parseTime(f[rOccurredAt]); !p.ok() {
		return "occurred_at", p
	}
	switch v := f[rFinal]; {
	case v == nil || isNull(v):
	case v[0] == 't':
		r.Final = true
	case v[0] == 'f':
	default:
		return "final", problem{ReasonWrongType, mustBe("true or false", v)}
	}
	return "", problem{}
}

func (d *decoder) intern(b []byte) string {
	if s, ok := d.meters[string(b)]; ok {
		return s
	}
	if d.meters == nil {
		d.meters = make(map[string]string)
	}
	s := string(b)
	d.meters[s] = s
	return s
}

// Field parsers. raw is the field's JSON value, nil when absent.

const missing = "is missing"

// stringField returns the unescaped bytes of a JSON string; bad names the
// reason for a string that cannot be unescaped (an unpaired surrogate).
func stringField(raw []byte, bad Reason) ([]byte, problem) {
	switch {
	case raw == nil:
		return nil, problem{ReasonMissingField, missing}
	case raw[0] != '"':
		return nil, problem{ReasonWrongType, mustBe("a string", raw)}
	}
	s, detail := unquote(raw)
	if detail != "" {
		return nil, problem{bad, clipRaw(raw) + " " + detail}
	}
	return s, problem{}
}

func parseUUID(raw []byte) (uuid.UUID, problem) {
	s, p := stringField(raw, ReasonBadUUID)
	if !p.ok() {
		return uuid.Nil, p
	}
	var u uuid.UUID
	var err error
	if len(s) == 36 { // uuid.ParseBytes also takes 32 hex digits, braces and urn: forms
		u, err = uuid.ParseBytes(s)
	}
	switch {
	case len(s) != 36 || err != nil:
		return uuid.Nil, problem{ReasonBadUUID, quote(string(s)) + " is not a UUID in the 8-4-4-4-12 hex form"}
	case u == uuid.Nil:
		return uuid.Nil, problem{ReasonBadUUID, quote(string(s)) + " is the nil UUID"}
	}
	return u, problem{}
}

// parseInt reads epoch or seq: a JSON integer >= 1 that fits in an int64.
func parseInt(raw []byte, bad Reason) (int64, problem) {
	if raw == nil {
		return 0, problem{ReasonMissingField, missing}
	}
	if c := raw[0]; c != '-' && (c < '0' || c > '9') {
		return 0, problem{ReasonWrongType, mustBe("an integer", raw)}
	}
	if bytes.ContainsAny(raw, ".eE") {
		return 0, problem{bad, clipRaw(raw) + " is not an integer"}
	}
	var v int64
	if raw[0] != '-' {
		for _, c := range raw {
			if v > (1<<63-1-int64(c-'0'))/10 {
				return 0, problem{bad, clipRaw(raw) + " does not fit in a 64-bit integer"}
			}
			v = v*10 + int64(c-'0')
		}
	}
	if v < 1 {
		if bad == ReasonBadEpoch {
			return 0, problem{bad, clipRaw(raw) + " is not positive; epochs start at 1"}
		}
		return 0, problem{bad, seqBelowOne(clipRaw(raw))}
	}
	return v, problem{}
}

// parseDecimal reads a total or quantity: an exact decimal >= 0 as a JSON
// string, or a JSON integer.
func parseDecimal(raw []byte) (decimal.Decimal, problem) {
	if raw == nil {
		return decimal.Decimal{}, problem{ReasonMissingField, missing}
	}
	var text string
	switch c := raw[0]; {
	case c == '"':
		s, detail := unquote(raw)
		if detail != "" {
			return decimal.Decimal{}, problem{ReasonBadDecimal, clipRaw(raw) + " " + detail}
		}
		text = string(s)
	case c == '-' || c >= '0' && c <= '9':
		if bytes.ContainsAny(raw, ".eE") {
			return decimal.Decimal{}, problem{ReasonBadDecimal, clipRaw(raw) +
				` is a JSON number with a fraction or exponent; send exact decimals as strings, like "12.5"`}
		}
		text = string(raw)
	default:
		return decimal.Decimal{}, problem{ReasonWrongType, mustBe(`a decimal string such as "12.5"`, raw)}
	}
	d, err := amount.ParseNonNegative(text)
	if err == nil {
		return d, problem{}
	}
	shown := clipRaw(raw) // a JSON number as sent, a string quoted
	if raw[0] == '"' {
		shown = quote(text)
	}
	switch {
	case len(text) > maxDecimalText && plainDecimal(text):
		// amount.Parse refuses such text as a syntax error; it is a
		// well-formed number that is too long.
		return decimal.Decimal{}, problem{ReasonDecimalOutOfRange,
			fmt.Sprintf("%s is %d characters long; at most %d", shown, len(text), maxDecimalText)}
	case errors.Is(err, amount.ErrNegative):
		return decimal.Decimal{}, problem{ReasonNegative, shown + " is negative; totals and quantities are never below zero"}
	case errors.Is(err, amount.ErrScale):
		return decimal.Decimal{}, problem{ReasonDecimalOutOfRange, shown + " has " + amount.ErrScale.Error()}
	case errors.Is(err, amount.ErrDigits):
		return decimal.Decimal{}, problem{ReasonDecimalOutOfRange, shown + " has " + amount.ErrDigits.Error()}
	default:
		return decimal.Decimal{}, problem{ReasonBadDecimal, shown + " is not a decimal number"}
	}
}

// maxDecimalText is the longest text amount.Parse reads.
const maxDecimalText = 80

// plainDecimal reports whether s has the form -?[0-9]+(\.[0-9]+)?, whatever its length.
func plainDecimal(s string) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	digits, frac, dot := 0, 0, false
	for ; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9' && dot:
			frac++
		case c >= '0' && c <= '9':
			digits++
		case c == '.' && !dot && digits > 0:
			dot = true
		default:
			return false
		}
	}
	return digits > 0 && (!dot || frac > 0)
}

func parseTime(raw []byte) (time.Time, problem) {
	s, p := stringField(raw, ReasonBadTimestamp)
	if !p.ok() {
		return time.Time{}, p
	}
	t, ok := parseRFC3339(s)
	if !ok {
		return time.Time{}, problem{ReasonBadTimestamp, quote(string(s)) +
			` is not an RFC 3339 timestamp with a zone, like "2026-12-02T10:00:00Z"`}
	}
	if d := timeRangeProblem(t); d != "" {
		return time.Time{}, problem{ReasonBadTimestamp, quote(string(s)) + d}
	}
	return t, problem{}
}

// parseRFC3339 reads YYYY-MM-DDTHH:MM:SS[.F](Z|±HH:MM) with 1 to 9
// fractional digits and returns the instant in UTC. It is stricter than
// time.Parse, which accepts one-digit hours, a comma before the fraction
// and more than nine fractional digits (silently truncated).
func parseRFC3339(b []byte) (time.Time, bool) {
	if len(b) < len("2006-01-02T15:04:05Z") {
		return time.Time{}, false
	}
	year, ok1 := digits(b[0:4])
	month, ok2 := digits(b[5:7])
	day, ok3 := digits(b[8:10])
	hour, ok4 := digits(b[11:13])
	minute, ok5 := digits(b[14:16])
	sec, ok6 := digits(b[17:19])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) ||
		b[4] != '-' || b[7] != '-' || (b[10] != 'T' && b[10] != 't') || b[13] != ':' || b[16] != ':' ||
		month < 1 || month > 12 || day < 1 || day > daysIn(month, year) ||
		hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	i, nsec := 19, 0
	if b[i] == '.' {
		j := i + 1
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
		n := j - i - 1
		if n < 1 || n > 9 {
			return time.Time{}, false
		}
		nsec, _ = digits(b[i+1 : j])
		for ; n < 9; n++ {
			nsec *= 10
		}
		i = j
	}
	offset := 0
	switch z := b[i:]; {
	case len(z) == 1 && (z[0] == 'Z' || z[0] == 'z'):
	case len(z) == 6 && (z[0] == '+' || z[0] == '-') && z[3] == ':':
		hh, ok1 := digits(z[1:3])
		mm, ok2 := digits(z[4:6])
		if !ok1 || !ok2 || hh > 23 || mm > 59 {
			return time.Time{}, false
		}
		offset = hh*3600 + mm*60
		if z[0] == '-' {
			offset = -offset
		}
	default:
		return time.Time{}, false
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	return t.Add(-time.Duration(offset) * time.Second), true
}

func digits(b []byte) (int, bool) {
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

func daysIn(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

func isNull(raw []byte) bool { return raw[0] == 'n' }

// kind names the JSON type of a value.
func kind(raw []byte) string {
	switch raw[0] {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

// mustBe describes a value of the wrong JSON type, showing scalars.
func mustBe(want string, raw []byte) string {
	got := kind(raw)
	switch got {
	case "object", "array", "null":
		return "must be " + want + ", got " + got
	}
	return "must be " + want + ", got " + got + " " + clipRaw(raw)
}

func repeated(at int) string {
	return fmt.Sprintf("key appears twice (again at offset %d); repeated keys are ambiguous", at)
}

// syntaxDetail explains why value is not JSON, with encoding/json's offset.
func syntaxDetail(value []byte) string {
	var raw json.RawMessage
	err := json.Unmarshal(value, &raw)
	if se := (*json.SyntaxError)(nil); errors.As(err, &se) {
		return fmt.Sprintf("invalid JSON at offset %d: %s", se.Offset, se.Error())
	}
	return "invalid JSON"
}

// unquote returns the content of the JSON string raw (quotes included). It
// fails on an escaped unpaired UTF-16 surrogate, which encoding/json would
// silently turn into U+FFFD; invalid UTF-8 bytes are passed through for the
// caller's rules to reject.
func unquote(raw []byte) ([]byte, string) {
	b := raw[1 : len(raw)-1]
	if bytes.IndexByte(b, '\\') < 0 {
		return b, ""
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); {
		c := b[i]
		if c != '\\' {
			out = append(out, c)
			i++
			continue
		}
		switch e := b[i+1]; e {
		case 'u':
			r := hex4(b[i+2 : i+6])
			i += 6
			if utf16.IsSurrogate(r) {
				if r < 0xdc00 && i+6 <= len(b) && b[i] == '\\' && b[i+1] == 'u' {
					if r2 := hex4(b[i+2 : i+6]); r2 >= 0xdc00 && r2 <= 0xdfff {
						out = utf8.AppendRune(out, utf16.DecodeRune(r, r2))
						i += 6
						continue
					}
				}
				return nil, "has an unpaired UTF-16 surrogate escape"
			}
			out = utf8.AppendRune(out, r)
			continue
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		default: // '"', '\\', '/'
			out = append(out, e)
		}
		i += 2
	}
	return out, ""
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// A minimal scanner over JSON that json.Valid has accepted. encoding/json
// cannot report repeated keys, replaces bad UTF-8 without a word, and its
// Token API allocates per token; walking valid JSON is simple and keeps every
// value's exact bytes and offset.

func skipSpace(d []byte, i int) int {
	for i < len(d) && (d[i] == ' ' || d[i] == '\t' || d[i] == '\n' || d[i] == '\r') {
		i++
	}
	return i
}

// endString returns the offset just past the string that starts at d[i].
func endString(d []byte, i int) int {
	j := i + 1
	for {
		q := j + bytes.IndexByte(d[j:], '"')
		n := 0
		for p := q - 1; p > i && d[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return q + 1
		}
		j = q + 1
	}
}

// endValue returns the offset just past the value that starts at d[i].
func endValue(d []byte, i int) int {
	switch d[i] {
	case '"':
		return endString(d, i)
	case '{', '[':
		depth := 0
		for i < len(d) {
			switch d[i] {
			case '"':
				i = endString(d, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i < len(d) {
		switch d[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

// members iterates over an object's members; i starts just past the '{'.
type members struct {
	d []byte
	i int
}

type member struct {
	key   []byte // raw, with quotes
	keyAt int    // offset of the key in the message
	val   []byte // raw value; nil for an absent member
	at    int    // offset of the value in the message
}

// name returns the key unescaped. A key that cannot be unescaped comes back
// raw; it matches no field name and is reported as unknown.
func (m member) name() []byte {
	s, detail := unquote(m.key)
	if detail != "" {
		return m.key[1 : len(m.key)-1]
	}
	return s
}

func (it *members) next() (member, bool) {
	d := it.d
	i := skipSpace(d, it.i)
	if d[i] == '}' {
		it.i = i + 1
		return member{}, false
	}
	if d[i] == ',' {
		i = skipSpace(d, i+1)
	}
	keyAt := i
	end := endString(d, i)
	i = skipSpace(d, end) // at ':'
	i = skipSpace(d, i+1) // at the value
	vend := endValue(d, i)
	it.i = vend
	return member{key: d[keyAt:end], keyAt: keyAt, val: d[i:vend], at: i}, true
}

// elems iterates over an array's elements; i starts just past the '['.
type elems struct {
	d []byte
	i int
}

func (it *elems) next() (val []byte, at int, ok bool) {
	d := it.d
	i := skipSpace(d, it.i)
	if d[i] == ']' {
		it.i = i + 1
		return nil, 0, false
	}
	if d[i] == ',' {
		i = skipSpace(d, i+1)
	}
	end := endValue(d, i)
	it.i = end
	return d[i:end], i, true
}
