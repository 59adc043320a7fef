package ledger

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/shopspring/decimal"
)

// The records of a micro-batch go to Postgres as one binary COPY that the
// ledger encodes itself (docs/ingest-breakdown.md): pgx's generic CopyFrom
// looks up an encode plan per value through reflection, boxes every value
// in an interface, and encodes each NUMERIC with math/big division; for the
// fifteen fixed columns of records that was the largest single item of
// ingest's CPU. The bytes are the binary format pgx writes too (the
// "Binary Format" of COPY in the PostgreSQL documentation), column for
// column of recordColumns (qCopyRecords), whose types TestCopyColumnTypes
// pins.

var recordColumns = []string{"stream_id", "seq", "operation_id", "customer", "meter", "total", "quantity", "occurred_at",
	"final", "late_fill", "billed", "period_start", "bucket", "prior_period", "ingested_at"}

// copyHeader opens a binary COPY stream: the signature, no flags, no
// header extension.
var copyHeader = []byte("PGCOPY\n\xff\r\n\x00\x00\x00\x00\x00\x00\x00\x00\x00")

// copyRecords writes the new records with one binary COPY: the bulk of
// every micro-batch, and the fastest way into Postgres. (Uniqueness was
// decided under the stream locks, but for the operation ids load did not
// look up; the table's unique keys are the backstop.)
func (a *applier) copyRecords(ctx context.Context, tx pgx.Tx) error {
	return a.copyRows(ctx, tx, "records", recordColumns, qCopyRecords, len(a.newRecords), 192, func(buf []byte, i int) ([]byte, error) {
		return appendRecordRow(buf, &a.newRecords[i], a.now)
	})
}

// copyRows writes n new rows into table with one binary COPY of columns
// (statement), through copyNew: row appends the fields of the i-th
// (about rowBytes of them), copyRows the stream's header, each row's
// field count and the trailer.
func (a *applier) copyRows(ctx context.Context, tx pgx.Tx, table string, columns []string, statement string, n, rowBytes int,
	row func(buf []byte, i int) ([]byte, error)) error {
	if n == 0 {
		return nil
	}
	buf := make([]byte, 0, len(copyHeader)+n*rowBytes+2)
	buf = append(buf, copyHeader...)
	var err error
	for i := range n {
		buf = binary.BigEndian.AppendUint16(buf, uint16(len(columns)))
		if buf, err = row(buf, i); err != nil {
			return fmt.Errorf("ledger: write %s: %w", table, err)
		}
	}
	buf = binary.BigEndian.AppendUint16(buf, 0xffff) // the trailer: a field count of -1
	return a.copyNew(ctx, tx, table, columns, statement, buf, n)
}

// appendKeyFields appends the first fields of every table of new usage
// (records and readings): stream_id, seq, operation_id, customer, meter.
func appendKeyFields(buf []byte, streamID int64, r *Record) []byte {
	buf = appendInt8Field(buf, streamID)
	buf = appendInt8Field(buf, r.Seq)
	buf = appendField(buf, r.OperationID[:])
	buf = appendTextField(buf, r.Stream.Customer)
	return appendTextField(buf, r.Stream.Meter)
}

// copyNew sends a COPY stream of rows new records or readings into table,
// whose unique key on operation_id is table_operation_id_key. Uniqueness
// was decided under the stream locks, but for the operation ids the load
// did not look up: when the key refuses one of those, the error wraps
// errOperationTaken and Apply tries again, looking every id up.
func (a *applier) copyNew(ctx context.Context, tx pgx.Tx, table string, columns []string, statement string, stream []byte, rows int) error {
	if err := copyIn(ctx, tx.Conn(), table, columns, statement, stream, int64(rows)); err != nil {
		var pe *pgconn.PgError
		if !a.lookupAll && errors.As(err, &pe) && pe.Code == uniqueViolation && pe.ConstraintName == table+"_operation_id_key" {
			return fmt.Errorf("%w: %w", errOperationTaken, err)
		}
		return fmt.Errorf("ledger: write %s: %w", table, err)
	}
	return nil
}

// uniqueViolation is Postgres's SQLSTATE for breaking a unique key.
const uniqueViolation = "23505"

// copyIn sends the encoded COPY stream (statement copies into table's
// columns), telling the connection's tracer (if it traces COPY) as
// pgx.Conn.CopyFrom would.
func copyIn(ctx context.Context, conn *pgx.Conn, table string, columns []string, statement string, stream []byte, rows int64) error {
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

// appendRecordRow appends the fields of one row of recordColumns.
func appendRecordRow(buf []byte, nr *newRecord, now time.Time) ([]byte, error) {
	r := nr.rec
	var err error
	buf = appendKeyFields(buf, nr.streamID, r)
	if buf, err = appendNumericField(buf, r.Total); err != nil {
		return nil, fmt.Errorf("total: %w", err)
	}
	if r.Quantity.Valid {
		if buf, err = appendNumericField(buf, r.Quantity.Decimal); err != nil {
			return nil, fmt.Errorf("quantity: %w", err)
		}
	} else {
		buf = appendNull(buf)
	}
	buf = appendTimeField(buf, r.OccurredAt)
	buf = appendBoolField(buf, r.Final)
	buf = appendBoolField(buf, nr.lateFill)
	if buf, err = appendNumericField(buf, nr.billed); err != nil {
		return nil, fmt.Errorf("billed: %w", err)
	}
	buf = appendTimeField(buf, nr.period)
	buf = appendTimeField(buf, nr.bucket)
	if nr.priorPeriod != nil {
		buf = appendTimeField(buf, *nr.priorPeriod)
	} else {
		buf = appendNull(buf)
	}
	return appendTimeField(buf, now), nil
}

func appendNull(buf []byte) []byte { return binary.BigEndian.AppendUint32(buf, 0xffffffff) }

func appendField(buf, v []byte) []byte {
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(v)))
	return append(buf, v...)
}

func appendTextField(buf []byte, s string) []byte {
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(s)))
	return append(buf, s...)
}

func appendInt8Field(buf []byte, v int64) []byte {
	buf = binary.BigEndian.AppendUint32(buf, 8)
	return binary.BigEndian.AppendUint64(buf, uint64(v))
}

func appendBoolField(buf []byte, v bool) []byte {
	buf = binary.BigEndian.AppendUint32(buf, 1)
	if v {
		return append(buf, 1)
	}
	return append(buf, 0)
}

// microsecFromUnixEpochToY2K: timestamptz counts microseconds from 2000-01-01 UTC.
const microsecFromUnixEpochToY2K = 946684800 * 1000000

// appendTimeField encodes t as timestamptz, the way pgx does (sub-microsecond
// digits dropped; the ledger truncates its times to microseconds anyway).
func appendTimeField(buf []byte, t time.Time) []byte {
	us := t.Unix()*1000000 + int64(t.Nanosecond())/1000 - microsecFromUnixEpochToY2K
	buf = binary.BigEndian.AppendUint32(buf, 8)
	return binary.BigEndian.AppendUint64(buf, uint64(us))
}

// appendNumericField encodes d as NUMERIC: its value, and its scale
// (digits after the point, as sent: "1.50" keeps two). Coefficients below
// 10^15 (every total of up to 15 significant digits) take a path with
// no big.Int arithmetic; larger ones go through pgx's own encoder.
func appendNumericField(buf []byte, d decimal.Decimal) ([]byte, error) {
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
