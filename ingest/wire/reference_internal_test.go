package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// decodeReference is Decode as it was before Decode read the message in one
// pass: encoding/json.Valid over the whole message, then a count of the
// records, then a walk over them with a scanner that assumes valid JSON.
// FuzzDecodeReference and TestDecodeAgreesWithReference check that Decode
// returns exactly what it returns.
func decodeReference(key, value []byte) (b Batch, index []int, rejected []RecordError, err error) {
	if len(value) > MaxMessageBytes {
		return fail(ReasonMessageTooLarge, "", tooLarge(len(value)))
	}
	if p := idProblem(key); p != "" {
		return fail(ReasonBadKey, "", "message key "+p)
	}
	if len(bytes.TrimSpace(value)) == 0 {
		return fail(ReasonBadJSON, "", emptyMessage)
	}
	if !json.Valid(value) {
		return fail(ReasonBadJSON, "", syntaxDetail(value))
	}
	start := skipSpace(value, 0)
	if value[start] != '{' {
		return fail(ReasonBadJSON, "", "message must be a JSON object, got "+kind(value[start:]))
	}

	var top [nTop]refMember
	var unknown []byte
	haveUnknown := false
	it := refMembers{d: value, i: start + 1}
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
	if b.SentAt, p = parseTime(top[fSentAt].val, timeRangeProblem); !p.ok() {
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
	for el := (refElems{d: value, i: recordsAt + 1}); ; n++ {
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
		var r Record
		end, field, p := d.recordReference(pos, &r)
		if end < 0 {
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

// recordReference is decoder.record as it was, over valid JSON.
func (d *decoder) recordReference(at int, r *Record) (end int, field string, p problem) {
	if d.data[at] != '{' {
		return -1, "", problem{ReasonWrongType, mustBe("an object", d.data[at:endValue(d.data, at)])}
	}
	var f [nRec][]byte
	it := refMembers{d: d.data, i: at + 1}
	for {
		m, ok := it.next()
		if !ok {
			break
		}
		k := recField(m.name())
		if k < 0 {
			return -1, string(m.name()), problem{ReasonUnknownField, "is not a meter.batch.v1 record field; records have " + recList}
		}
		if f[k] != nil {
			return -1, recNames[k], problem{ReasonBadJSON, repeated(m.keyAt)}
		}
		f[k] = m.val
	}
	end = it.i
	field, p = d.fields(r, &f)
	return end, field, p
}

// The scanner the reference decoder walked valid JSON with.

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

// refMembers iterates over an object's members; i starts just past the '{'.
type refMembers struct {
	d []byte
	i int
}

type refMember struct {
	key   []byte // raw, with quotes
	keyAt int    // offset of the key in the message
	val   []byte // raw value; nil for an absent member
	at    int    // offset of the value in the message
}

func (m refMember) name() []byte {
	s, detail := unquote(m.key)
	if detail != "" {
		return m.key[1 : len(m.key)-1]
	}
	return s
}

func (it *refMembers) next() (refMember, bool) {
	d := it.d
	i := skipSpace(d, it.i)
	if d[i] == '}' {
		it.i = i + 1
		return refMember{}, false
	}
	if d[i] == ',' {
		i = skipSpace(d, i+1)
	}
	keyAt := i
	end := endString(d, i)
	i = skipSpace(d, end)
	i = skipSpace(d, i+1)
	vend := endValue(d, i)
	it.i = vend
	return refMember{key: d[keyAt:end], keyAt: keyAt, val: d[i:vend], at: i}, true
}

// refElems iterates over an array's elements; i starts just past the '['.
type refElems struct {
	d []byte
	i int
}

func (it *refElems) next() (val []byte, at int, ok bool) {
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

// checkAgainstReference fails t unless Decode returns exactly what
// decodeReference returns for key and value: the same batch (offsets of
// records included), index, rejected records and error, nil slices where
// it returns nil.
func checkAgainstReference(t *testing.T, what string, key, value []byte) {
	t.Helper()
	b, index, rejected, err := Decode(key, value)
	rb, rindex, rrejected, rerr := decodeReference(key, value)
	if !reflect.DeepEqual(err, rerr) {
		t.Fatalf("%s: Decode error %#v, reference %#v\nkey %q value %q", what, err, rerr, key, clip(value))
	}
	if !reflect.DeepEqual(b, rb) || !reflect.DeepEqual(index, rindex) || !reflect.DeepEqual(rejected, rrejected) {
		t.Fatalf("%s: Decode and the reference differ\nDecode:    %+v %v %+v\nreference: %+v %v %+v\nkey %q value %q",
			what, b, index, rejected, rb, rindex, rrejected, key, clip(value))
	}
}

// referenceCases are messages at the edges of the one-pass reading: fields
// in any order, repeated and unknown fields before and after the records,
// syntax errors after a problem was found, the nesting limit at each depth
// a value can lie at, the record limit.
func referenceCases() []string {
	const rec = `{"operation_id":"01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a11","customer":"acme","meter":"api_calls","seq":1,"total":"5","occurred_at":"2026-12-02T09:59:58Z"}`
	const head = `"schema":"meter.batch.v1","batch_id":"01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a10","producer":"gw","epoch":3,"sent_at":"2026-12-02T10:00:00Z"`
	msg := func(records string) string { return `{` + head + `,"records":[` + records + `]}` }
	nest := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	many := func(n int, el string) string { return strings.TrimSuffix(strings.Repeat(el+",", n), ",") }
	cases := []string{
		msg(rec), msg(rec + "," + rec), msg(" " + rec + " , " + rec + " "),
		`{"records":[` + rec + `],` + head + `}`,
		`{"records":[` + rec + `],` + head + `,"records":[]}`,
		`{"records":[` + rec + `],` + head + `,"schema":"x"}`,
		`{"records":[` + rec + `],` + head + `,"extra":1}`,
		`{"records":[` + rec + `],` + head + `,"extra":1,"records":2}`,
		`{` + head + `,` + head + `,"records":[` + rec + `]}`,
		`{"x":1,"records":[` + rec + `],"y":2,"records":[],` + head + `,"epoch":0}`,
		`{"records":{"a":` + rec + `},` + head + `}`,
		`{"records":"[]",` + head + `}`,
		`{"records":[],` + head + `}`, `{"records":[ ],` + head + `}`,
		`{"a\u0062":1,` + head + `,"records":[` + rec + `]}`,
		`{"\ud800":1,` + head + `,"records":[` + rec + `]}`,
		`{"\u0072ecords":[` + rec + `],` + head + `}`,
		msg(`{"x":1,"seq":[}`), msg(`{"seq":1,"seq":2,]`), msg(`{"x":1}`) + ` x`, msg(`{"x":1},`),
		msg(`{"seq":1,"seq":2}`), msg(`{"seq":1,"x":[1,{"a":2}]}`), msg(`{}`), msg(`{ }`), msg(`[]`), msg(`1`), msg(`"x"`), msg(`null`),
		msg(`{"seq":1,"total":"5","total":"6"}`), msg(`{"seq":1 "total":"5"}`), msg(`{"seq":1,}`), msg(`{,}`), msg(`{"seq"}`),
		msg(rec + `,`), msg(`,` + rec), msg(rec + ` ` + rec), msg(rec + `]`), msg(rec) + `}`, msg(rec)[:len(msg(rec))-1],
		msg(many(MaxRecords, rec)), msg(many(MaxRecords+1, `{}`)), msg(many(MaxRecords+1, `{}`) + `,`),
		msg(many(MaxRecords+2, `1`)), msg(many(MaxRecords+1, `{"x":1}`) + `,{"a":[}`),
		`{}`, ` { } `, `{`, `[]`, `"x"`, ``, ` `, "\ufeff{}", `{"schema":1}`, `{"schema":"meter.batch.v1"}x`,
		`{"schema":"meter.batch.v1",}`, `{"records":`, `{"records": `, `{"records"`, `{"records":[`, `{"records":[{`, `{"records":[{"seq":`, `{"schema" "x"}`, `{"schema":}`, `{"schema":"meter.batch.v1","records":[` + rec,
	}
	// The nesting limit, counting the containers a value lies in: the
	// message, the records array, a record.
	for _, d := range []int{maxNesting - 4, maxNesting - 3, maxNesting - 2, maxNesting - 1, maxNesting} {
		cases = append(cases,
			`{"x":`+nest(d)+`,`+head+`,"records":[`+rec+`]}`,
			msg(nest(d)),
			msg(`{"x":`+nest(d)+`}`),
			msg(`{"seq":1,"x":`+nest(d)+`}`),
			msg(strings.Replace(rec, `"seq":1`, `"seq":`+nest(d), 1)),
		)
	}
	return cases
}

func TestDecodeAgreesWithReference(t *testing.T) {
	key := []byte("acme")
	for i, c := range referenceCases() {
		checkAgainstReference(t, fmt.Sprintf("case %d", i), key, []byte(c))
	}
	files, err := filepath.Glob("../../testdata/batches/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no sample messages: %v", err)
	}
	corpus, _ := filepath.Glob("testdata/fuzz/FuzzDecode/*")
	for _, name := range append(files, corpus...) {
		d, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		k := key
		if strings.HasPrefix(string(d), "go test fuzz v1\n") {
			if k, d, err = readCorpusEntry(d); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		checkAgainstReference(t, name, k, d)
		if len(d) > 2<<10 || !strings.HasPrefix(filepath.Base(name), "valid-") {
			continue
		}
		// Each byte of a valid sample message in turn replaced by a byte that
		// matters to the grammar, and deleted.
		m := make([]byte, len(d))
		for i := range d {
			for _, b := range []byte(`{}[]",:\ 1`) {
				copy(m, d)
				m[i] = b
				checkAgainstReference(t, name+" mutated", k, m)
			}
			checkAgainstReference(t, name+" cut", k, append(d[:i:i], d[i+1:]...))
		}
	}
}

// readCorpusEntry reads a FuzzDecode corpus file: two []byte values.
func readCorpusEntry(d []byte) (key, value []byte, err error) {
	lines := strings.Split(strings.TrimSpace(string(d)), "\n")
	if len(lines) != 3 {
		return nil, nil, fmt.Errorf("want a header and two values, got %d lines", len(lines))
	}
	var out [2][]byte
	for i, l := range lines[1:] {
		s, ok := strings.CutPrefix(l, "[]byte(")
		if !ok || !strings.HasSuffix(s, ")") {
			return nil, nil, fmt.Errorf("line %q is not a []byte", l)
		}
		u, err := strconv.Unquote(s[:len(s)-1])
		if err != nil {
			return nil, nil, err
		}
		out[i] = []byte(u)
	}
	return out[0], out[1], nil
}

// FuzzDecodeReference checks that Decode returns exactly what
// decodeReference returns, for any key and value.
func FuzzDecodeReference(f *testing.F) {
	for _, c := range referenceCases() {
		if len(c) <= 64<<10 {
			f.Add([]byte("acme"), []byte(c))
		}
	}
	files, _ := filepath.Glob("../../testdata/batches/*.json")
	for _, name := range files {
		if d, err := os.ReadFile(name); err == nil && len(d) <= 64<<10 {
			f.Add([]byte("acme"), d)
		}
	}
	f.Fuzz(func(t *testing.T, key, value []byte) {
		checkAgainstReference(t, "fuzz", key, value)
	})
}

// TestMinRecordBytes checks that the record minRecordBytes describes is
// accepted and is that long: each of its required fields at its shortest.
func TestMinRecordBytes(t *testing.T) {
	rec := `{"operation_id":"00000000-0000-0000-0000-000000000001","customer":"a","meter":"a","seq":1,"total":0,"occurred_at":"1970-02-02T00:00:00Z"}`
	value := `{"schema":"meter.batch.v1","batch_id":"01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a10","producer":"p","epoch":1,` +
		`"sent_at":"2026-12-02T10:00:00Z","records":[` + rec + `]}`
	b, _, rejected, err := Decode([]byte("a"), []byte(value))
	if err != nil || len(rejected) > 0 || len(b.Records) != 1 {
		t.Fatalf("Decode: %v %v", err, rejected)
	}
	if len(rec) != minRecordBytes {
		t.Fatalf("the shortest record is %d bytes, minRecordBytes %d", len(rec), minRecordBytes)
	}
}
