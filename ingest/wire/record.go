package wire

import (
	"bytes"
	"fmt"
	"unicode"
	"unicode/utf8"
)

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
	rLevel
	rMember
	nRec
)

var recNames = [nRec]string{"operation_id", "customer", "meter", "seq", "total", "quantity", "occurred_at", "final", "level", "member"}

const recList = "operation_id, customer, meter, seq, total, quantity, occurred_at, final, level, member"

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
	case "level":
		return rLevel
	case "member":
		return rMember
	}
	return -1
}

// record decodes the record whose JSON starts at offset at of the message
// into r, which is zero, checking its syntax as it goes. It returns the
// offset just past the record, or -1 on a syntax error (in the record or,
// if at is past the end, its absence); and on a problem, the offending
// field's name ("" for the record as a whole).
func (d *decoder) record(at int, r *Record) (end int, field string, p problem) {
	v := d.data
	if at >= len(v) || v[at] != '{' {
		if end = validValue(v, at, 2); end < 0 {
			return -1, "", problem{}
		}
		return end, "", problem{ReasonWrongType, mustBe("an object", v[at:end])}
	}
	var f [nRec][]byte
	i := skipSpace(v, at+1)
	if i < len(v) && v[i] == '}' {
		end = i + 1
	} else {
		for {
			keyAt := i
			keyEnd, valAt := validKey(v, i)
			if valAt < 0 {
				return -1, "", problem{}
			}
			// A rejected record's end is found by reading it again whole.
			name := keyName(v[keyAt:keyEnd])
			k := recField(name)
			if k < 0 {
				return validValue(v, at, 2), string(name), problem{ReasonUnknownField, "is not a meter.batch.v1 record field; records have " + recList}
			}
			if f[k] != nil {
				return validValue(v, at, 2), recNames[k], problem{ReasonBadJSON, repeated(keyAt)}
			}
			valEnd := validValue(v, valAt, 3)
			if valEnd < 0 {
				return -1, "", problem{}
			}
			f[k] = v[valAt:valEnd]
			i = skipSpace(v, valEnd)
			if i < len(v) && v[i] == ',' {
				i = skipSpace(v, i+1)
				continue
			}
			if i < len(v) && v[i] == '}' {
				end = i + 1
				break
			}
			return -1, "", problem{}
		}
	}
	field, p = d.fields(r, &f)
	return end, field, p
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
	// A record carries a total (a counter), a level (a gauge) or a member
	// (a unique count): exactly one of them.
	switch {
	case f[rLevel] != nil && (f[rTotal] != nil || f[rMember] != nil):
		return "level", problem{ReasonMixedShape, mixedShape}
	case f[rMember] != nil && f[rTotal] != nil:
		return "member", problem{ReasonMixedShape, mixedShape}
	case f[rLevel] != nil:
		if q := f[rQuantity]; q != nil && !isNull(q) {
			return "quantity", problem{ReasonMixedShape, "is a counter's field; a gauge record carries its level alone"}
		}
		if r.Level.Decimal, p = parseDecimal(f[rLevel]); !p.ok() {
			return "level", p
		}
		r.Level.Valid = true
	case f[rMember] != nil:
		if q := f[rQuantity]; q != nil && !isNull(q) {
			return "quantity", problem{ReasonMixedShape, "is a counter's field; a unique record carries its member alone"}
		}
		m, p := stringField(f[rMember], ReasonBadMember)
		if p.ok() {
			if detail := memberProblem(m); detail != "" {
				p = problem{ReasonBadMember, detail}
			}
		}
		if !p.ok() {
			return "member", p
		}
		r.Member = string(m)
	case f[rTotal] == nil:
		return "total", problem{ReasonMissingField, "is missing; a record carries a total (a counter), a level (a gauge) or a member (a unique count)"}
	default:
		if r.Total, p = parseDecimal(f[rTotal]); !p.ok() {
			return "total", p
		}
	}
	if q := f[rQuantity]; q != nil && !isNull(q) {
		if r.Quantity.Decimal, p = parseDecimal(q); !p.ok() {
			return "quantity", p
		}
		r.Quantity.Valid = true
	}
	if r.OccurredAt, p = parseTime(f[rOccurredAt], occurredRangeProblem); !p.ok() {
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

const mixedShape = "is one of total, level and member: a record carries exactly one (its meter's kind decides which)"

// memberProblem checks a unique record's member: 1..MaxMemberLen characters
// of valid UTF-8 without control characters.
func memberProblem[T string | []byte](s T) string {
	if len(s) == 0 {
		return "is empty; members are 1 to 256 characters"
	}
	if !utf8.ValidString(string(s)) { // U+FFFD itself is a character like any other
		return quote(string(s)) + " is not valid UTF-8"
	}
	n := 0
	for _, c := range string(s) {
		if unicode.IsControl(c) {
			return quote(string(s)) + " has a control character; members are printable text"
		}
		n++
	}
	if n > MaxMemberLen {
		return fmt.Sprintf("%s is %d characters long; at most %d", quote(string(s)), n, MaxMemberLen)
	}
	return ""
}

// MaxMemberLen is the longest member a unique record may carry, in characters.
const MaxMemberLen = 256
