// Package pgcopy writes rows in the binary format of Postgres's COPY
// (the "Binary Format" of COPY in the PostgreSQL documentation) and sends
// them. pgx's generic CopyFrom looks up an encode plan per value through
// reflection, boxes every value in an interface, and encodes each NUMERIC
// with math/big division; for the ledger's records that was the largest
// single item of ingest's CPU (docs/ingest-breakdown.md). The bytes here
// are the ones pgx writes too.
//
// Stream writes a whole stream (its header, each row's field count and
// its trailer) around the fields each row appends.
package pgcopy

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/shopspring/decimal"
)

// header opens a binary COPY stream: the signature, no flags, no
// header extension.
var header = []byte("PGCOPY\n\xff\r\n\x00\x00\x00\x00\x00\x00\x00\x00\x00")

// Stream appends to buf a COPY stream of rows rows of columns fields
// each: the header, then each row's field count and the fields row
// appends for the i-th, then the trailer (a field count of -1).
func Stream(buf []byte, rows, columns int, row func(buf []byte, i int) ([]byte, error)) ([]byte, error) {
	buf = append(buf, header...)
	var err error
	for i := range rows {
		buf = binary.BigEndian.AppendUint16(buf, uint16(columns))
		if buf, err = row(buf, i); err != nil {
			return nil, err
		}
	}
	return binary.BigEndian.AppendUint16(buf, 0xffff), nil
}

// In sends an encoded COPY stream of rows rows (statement copies into table's
// columns), telling the connection's tracer (if it traces COPY) as
// pgx.Conn.CopyFrom would.
func In(ctx context.Context, conn *pgx.Conn, table string, columns []string, statement string, stream []byte, rows int64) error {
	tracer, _ := conn.Config().Tracer.(pgx.CopyFromTracer)
	if tracer != nil {
		ctx = tracer.TraceCopyFromStart(ctx, conn, pgx.TraceCopyFromStartData{
			TableName: pgx.Identifier{table}, ColumnNames: columns})
	}
	tag, err := conn.PgConn().CopyFrom(ctx, bytes.NewReader(stream), statement)
	if err == nil && tag.RowsAffected() != rows {
		err = fmt.Errorf("COPY wrote %d rows of %d", tag.RowsAffected(), rows)
	}
	if tracer != nil {
		tracer.TraceCopyFromEnd(ctx, conn, pgx.TraceCopyFromEndData{CommandTag: tag, Err: err})
	}
	return err
}

// Null appends a NULL field.
func Null(buf []byte) []byte { return binary.BigEndian.AppendUint32(buf, 0xffffffff) }

// Bytes appends a field of raw bytes (a uuid's sixteen, say).
func Bytes(buf, v []byte) []byte {
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(v)))
	return append(buf, v...)
}

// Text appends a text field.
func Text(buf []byte, s string) []byte {
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(s)))
	return append(buf, s...)
}

// Int8 appends a bigint field.
func Int8(buf []byte, v int64) []byte {
	buf = binary.BigEndian.AppendUint32(buf, 8)
	return binary.BigEndian.AppendUint64(buf, uint64(v))
}

// Bool appends a boolean field.
func Bool(buf []byte, v bool) []byte {
	buf = binary.BigEndian.AppendUint32(buf, 1)
	if v {
		return append(buf, 1)
	}
	return append(buf, 0)
}

// microsecFromUnixEpochToY2K: timestamptz counts microseconds from 2000-01-01 UTC.
const microsecFromUnixEpochToY2K = 946684800 * 1000000

// Time appends t as a timestamptz field, the way pgx does (sub-microsecond
// digits dropped; the ledger truncates its times to microseconds anyway).
func Time(buf []byte, t time.Time) []byte {
	us := t.Unix()*1000000 + int64(t.Nanosecond())/1000 - microsecFromUnixEpochToY2K
	buf = binary.BigEndian.AppendUint32(buf, 8)
	return binary.BigEndian.AppendUint64(buf, uint64(us))
}

// Numeric encodes d as NUMERIC: its value, and its scale
// (digits after the point, as sent: "1.50" keeps two). Coefficients below
// 10^15 (every total of up to 15 significant digits) take a path with
// no big.Int arithmetic; larger ones go through pgx's own encoder.
func Numeric(buf []byte, d decimal.Decimal) ([]byte, error) {
	lenAt := len(buf)
	buf = binary.BigEndian.AppendUint32(buf, 0) // the length, set below
	var err error
	if buf, err = appendNumeric(buf, d); err != nil {
		return nil, err
	}
	binary.BigEndian.PutUint32(buf[lenAt:], uint32(len(buf)-lenAt-4))
	return buf, nil
}

// numericSmallDigits bounds the coefficients of the fast path: below
// 10^15, times 1,000 (to align the exponent on a base-10,000 digit) they
// still fit in a uint64.
const numericSmallDigits = 15

var pow10 = [4]uint64{1, 10, 100, 1000}

// appendNumeric appends NUMERIC's binary form of d: ndigits, weight, sign,
// dscale (int16 each), then ndigits base-10,000 digits, most significant
// first; the value is the digits times 10,000^(weight-ndigits+1).
func appendNumeric(buf []byte, d decimal.Decimal) ([]byte, error) {
	exp := d.Exponent()
	// NumDigits and CoefficientInt64 read the coefficient without copying it.
	if d.NumDigits() > numericSmallDigits || exp < -math.MaxInt16+3 || exp > math.MaxInt16-3 {
		return appendNumericSlow(buf, d)
	}
	c := d.CoefficientInt64()
	var sign uint16
	if c < 0 {
		sign, c = 0x4000, -c
	}
	var dscale uint16
	if exp < 0 {
		dscale = uint16(-exp)
	}
	// Align the exponent down to a multiple of 4: value = u × 10,000^e4.
	e4 := exp >> 2 // floor division by 4
	u := uint64(c) * pow10[exp-e4<<2]
	var digits [5]uint16 // 10^18 has at most 5 base-10,000 digits; least significant first
	n := 0
	for ; u != 0; n++ {
		digits[n] = uint16(u % 10000)
		u /= 10000
	}
	// Trailing zero digits carry nothing (Postgres strips them too).
	lo := 0
	for lo < n && digits[lo] == 0 {
		lo++
	}
	if lo == n { // zero
		buf = binary.BigEndian.AppendUint16(buf, 0)
		buf = binary.BigEndian.AppendUint16(buf, 0)
		buf = binary.BigEndian.AppendUint16(buf, 0)
		return binary.BigEndian.AppendUint16(buf, dscale), nil
	}
	weight := int32(n-1) + e4
	if weight > math.MaxInt16 || weight < math.MinInt16 {
		return appendNumericSlow(buf, d)
	}
	buf = binary.BigEndian.AppendUint16(buf, uint16(n-lo))
	buf = binary.BigEndian.AppendUint16(buf, uint16(int16(weight)))
	buf = binary.BigEndian.AppendUint16(buf, sign)
	buf = binary.BigEndian.AppendUint16(buf, dscale)
	for i := n - 1; i >= lo; i-- {
		buf = binary.BigEndian.AppendUint16(buf, digits[i])
	}
	return buf, nil
}

// numericPlan encodes what the fast path leaves: pgx's binary NUMERIC
// encoder (stateless, so shared), the one every other statement of the
// ledger goes through.
var numericPlan = pgtype.NumericCodec{}.PlanEncode(nil, pgtype.NumericOID, pgtype.BinaryFormatCode, pgtype.Numeric{})

func appendNumericSlow(buf []byte, d decimal.Decimal) ([]byte, error) {
	return numericPlan.Encode(numeric(d), buf)
}

// numeric is d as pgx's NUMERIC value.
func numeric(d decimal.Decimal) pgtype.Numeric {
	return pgtype.Numeric{Int: d.Coefficient(), Exp: d.Exponent(), Valid: true}
}
