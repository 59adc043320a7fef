package wire

import (
	"bytes"
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
	if !valid(value) {
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
