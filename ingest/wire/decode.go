package wire

import (
	"bytes"
	"slices"
)

// emptyMessage is the detail of a message with no value (or only white
// space): a tombstone, or a producer that sent none.
const emptyMessage = "message is empty (a tombstone, or a producer that sent no value); a message is one JSON object"

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
	start := skipSpace(value, 0)
	if start == len(value) {
		return fail(ReasonBadJSON, "", emptyMessage)
	}
	if value[start] != '{' {
		if !valid(value) {
			return fail(ReasonBadJSON, "", syntaxDetail(value))
		}
		return fail(ReasonBadJSON, "", "message must be a JSON object, got "+kind(value[start:]))
	}
	d := decoder{data: value, key: key, keyStr: string(key)}
	if !d.message(start) {
		return fail(ReasonBadJSON, "", syntaxDetail(value))
	}
	// The message is valid JSON; its problems are reported in the order
	// above, wherever in the message they lie.
	if d.repeat >= 0 {
		return fail(ReasonBadJSON, topNames[d.repeat], repeated(d.repeatAt))
	}

	// The schema comes first: a message of another schema is reported as
	// such, not by whichever of its fields this decoder cannot read.
	schema, p := stringField(d.top[fSchema], ReasonUnknownSchema)
	if p.ok() && string(schema) != Schema {
		p = problem{ReasonUnknownSchema, unknownSchema(string(schema))}
	}
	if !p.ok() {
		return fail(p.reason, "schema", p.detail)
	}
	if d.haveUnknown {
		path := memberPath(string(d.unknown))
		if path[0] == '.' {
			path = path[1:]
		}
		return fail(ReasonUnknownField, path, "is not a meter.batch.v1 field; a batch has "+topList)
	}

	b.Schema = Schema
	if b.BatchID, p = parseUUID(d.top[fBatchID]); !p.ok() {
		return fail(p.reason, "batch_id", p.detail)
	}
	producer, p := stringField(d.top[fProducer], ReasonBadID)
	if p.ok() {
		if d := producerProblem(producer); d != "" {
			p = problem{ReasonBadID, d}
		}
	}
	if !p.ok() {
		return fail(p.reason, "producer", p.detail)
	}
	b.Producer = string(producer)
	if b.Epoch, p = parseInt(d.top[fEpoch], ReasonBadEpoch); !p.ok() {
		return fail(p.reason, "epoch", p.detail)
	}
	if b.SentAt, p = parseTime(d.top[fSentAt], timeRangeProblem); !p.ok() {
		return fail(p.reason, "sent_at", p.detail)
	}

	switch raw := d.top[fRecords]; {
	case raw == nil:
		return fail(ReasonMissingField, "records", missing)
	case raw[0] != '[':
		return fail(ReasonWrongType, "records", mustBe("an array", raw))
	}
	switch {
	case d.n == 0:
		return fail(ReasonEmptyBatch, "records", emptyBatch)
	case d.n > MaxRecords:
		return fail(ReasonTooManyRecords, "records", tooMany(d.n))
	}
	b.Records, b.spans = d.records, d.spans
	return b, d.index, d.rejected, nil
}

// message reads the object that starts at offset at, which is the whole
// message but for white space, in one pass: it checks the JSON syntax of
// every byte (as valid does), keeps each top-level field's first value and
// notes the first repeated and the first unknown field, and decodes the
// records array as it meets it. It returns false on a syntax error.
func (d *decoder) message(at int) bool {
	v := d.data
	d.repeat = -1
	i := skipSpace(v, at+1)
	if i < len(v) && v[i] == '}' {
		return skipSpace(v, i+1) == len(v)
	}
	for {
		keyAt := i
		keyEnd, valAt := validKey(v, i)
		if valAt < 0 {
			return false
		}
		name := keyName(v[keyAt:keyEnd])
		f := topField(name)
		var end int
		switch {
		case f < 0:
			if !d.haveUnknown {
				d.unknown, d.haveUnknown = name, true
			}
			end = validValue(v, valAt, 1)
		case d.top[f] != nil:
			if d.repeat < 0 {
				d.repeat, d.repeatAt = f, keyAt
			}
			end = validValue(v, valAt, 1)
		case f == fRecords && valAt < len(v) && v[valAt] == '[':
			end = d.recordsArray(valAt)
		default:
			end = validValue(v, valAt, 1)
		}
		if end < 0 {
			return false
		}
		if f >= 0 && d.top[f] == nil {
			d.top[f] = v[valAt:end]
		}
		i = skipSpace(v, end)
		switch {
		case i < len(v) && v[i] == ',':
			i = skipSpace(v, i+1)
		case i < len(v) && v[i] == '}':
			return skipSpace(v, i+1) == len(v)
		default:
			return false
		}
	}
}

// recordsArray reads the records array that starts at offset at ('['),
// decoding each record and counting them all (past MaxRecords it only
// counts: the message will be rejected). It returns the offset just past
// the array, or -1 on a syntax error.
func (d *decoder) recordsArray(at int) int {
	v := d.data
	i := skipSpace(v, at+1)
	if i < len(v) && v[i] == ']' {
		return i + 1
	}
	// Records of one message are alike: the first one's size tells about
	// how many there are (and no more can be accepted than records of the
	// shortest kind fit).
	if end := validValue(v, i, 2); end > i {
		n := min((len(v)-i)/max(end-i, minRecordBytes)+1, MaxRecords)
		d.records = make([]Record, 0, n)
		d.spans = make([][2]int, 0, n)
		d.index = make([]int, 0, n)
	}
	for n := 0; ; n++ {
		var end int
		if n < MaxRecords {
			// The record is decoded in place, in the next slot of
			// d.records (zero: fresh, or cleared below).
			if len(d.records) == cap(d.records) {
				d.records = slices.Grow(d.records, 1)
			}
			d.records = d.records[:len(d.records)+1]
			r := &d.records[len(d.records)-1]
			e, field, p := d.record(i, r)
			if end = e; end < 0 {
				return -1
			}
			if p.ok() {
				d.spans = append(d.spans, [2]int{i, end})
				d.index = append(d.index, n)
			} else {
				*r = Record{}
				d.records = d.records[:len(d.records)-1]
				d.rejected = append(d.rejected, RecordError{
					Index: n,
					Raw:   bytes.Clone(v[i:end]),
					Err:   Error{Reason: p.reason, Field: recordPath(n, field), Detail: p.detail},
				})
			}
		} else if end = validValue(v, i, 2); end < 0 {
			return -1
		}
		d.n = n + 1
		i = skipSpace(v, end)
		switch {
		case i < len(v) && v[i] == ',':
			i = skipSpace(v, i+1)
		case i < len(v) && v[i] == ']':
			return i + 1
		default:
			return -1
		}
	}
}

// minRecordBytes is the length of the shortest record Decode accepts
// (TestMinRecordBytes): {"operation_id":"<36 characters>","customer":"a",
// "meter":"a","seq":1,"total":0,"occurred_at":"1970-01-01T00:00:00Z"}.
const minRecordBytes = 137

func fail(r Reason, field, detail string) (Batch, []int, []RecordError, error) {
	return Batch{}, nil, nil, &Error{Reason: r, Field: field, Detail: detail}
}

// problem is an Error without its field path; the zero value means none.
type problem struct {
	reason Reason
	detail string
}

func (p problem) ok() bool { return p.reason == "" }

// decoder holds what one pass over a message finds.
type decoder struct {
	data   []byte
	key    []byte
	keyStr string            // every accepted Record.Customer shares this string
	meters map[string]string // meter ids seen, so a message allocates each once

	top         [nTop][]byte // each top-level field's raw value (its first, if repeated); nil when absent
	repeat      int          // the first top-level field met twice, or -1
	repeatAt    int          // the offset of its second key
	unknown     []byte       // the name of the first unknown top-level field
	haveUnknown bool

	n        int // how many elements the records array has
	records  []Record
	spans    [][2]int
	index    []int
	rejected []RecordError
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
