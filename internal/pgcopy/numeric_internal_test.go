package pgcopy

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/internal/pgtest"
)

// TestNumericEncoding sends decimals through the fast NUMERIC encoder and
// through pgx's, side by side in one binary COPY, and checks that Postgres
// stores the same value with the same scale for both, and the text the
// decimal stands for.
func TestNumericEncoding(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 30))
	var ds []decimal.Decimal
	for _, s := range []string{"0", "0.0", "0.000000000", "1", "1.50", "9999", "10000", "10000.0001", "0.0001",
		"0.00001", "123456789012345", "999999999999999", "1000000000000000", "-1", "-0.5", "-123456.789",
		"99999999999999999999999999999999999999", "12345678901234567890.123456789", "1e20", "5e-9", "100e3"} {
		ds = append(ds, decimal.RequireFromString(s))
	}
	for range 3000 {
		var c *big.Int
		switch rng.IntN(4) {
		case 0:
			c = big.NewInt(rng.Int64N(10000))
		case 1:
			c = big.NewInt(rng.Int64N(1_000_000_000_000_000))
		case 2:
			digits := make([]byte, rng.IntN(38)+1)
			for j := range digits {
				digits[j] = byte('0' + rng.IntN(10))
			}
			c, _ = new(big.Int).SetString(string(digits), 10)
		default:
			c = big.NewInt(rng.Int64())
		}
		if rng.IntN(5) == 0 {
			c.Neg(c)
		}
		ds = append(ds, decimal.NewFromBigInt(c, int32(rng.IntN(40)-25)))
	}

	if _, err := pool.Exec(ctx, `CREATE TABLE numeric_pairs (i int8, fast numeric, pgx numeric)`); err != nil {
		t.Fatal(err)
	}
	buf, err := Stream(nil, len(ds), 3, func(buf []byte, i int) ([]byte, error) {
		d := ds[i]
		buf = Int8(buf, int64(i))
		buf, err := Numeric(buf, d)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", d, err)
		}
		at := len(buf)
		buf = binary.BigEndian.AppendUint32(buf, 0)
		if buf, err = appendNumericSlow(buf, d); err != nil {
			return nil, fmt.Errorf("%s: %w", d, err)
		}
		binary.BigEndian.PutUint32(buf[at:], uint32(len(buf)-at-4))
		return buf, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Conn().PgConn().CopyFrom(ctx, strings.NewReader(string(buf)),
		`COPY numeric_pairs (i, fast, pgx) FROM STDIN BINARY`); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, `SELECT i, fast::text, pgx::text FROM numeric_pairs ORDER BY i`)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for ; rows.Next(); n++ {
		var i int
		var fast, viaPgx string
		if err := rows.Scan(&i, &fast, &viaPgx); err != nil {
			t.Fatal(err)
		}
		d := ds[i]
		want := d.StringFixed(max(0, -d.Exponent()))
		if fast != viaPgx || fast != want {
			t.Errorf("%s (coefficient %s, exponent %d): fast %s, pgx %s, want %s", d, d.Coefficient(), d.Exponent(), fast, viaPgx, want)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != len(ds) {
		t.Fatalf("%d rows for %d decimals", n, len(ds))
	}
}

func BenchmarkAppendNumeric(b *testing.B) {
	ds := []decimal.Decimal{decimal.RequireFromString("123456"), decimal.RequireFromString("12.5"), decimal.RequireFromString("0")}
	buf := make([]byte, 0, 64)
	for _, slow := range []bool{false, true} {
		b.Run(fmt.Sprintf("slow=%v", slow), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if slow {
					buf, _ = appendNumericSlow(buf[:0], ds[i%len(ds)])
				} else {
					buf, _ = appendNumeric(buf[:0], ds[i%len(ds)])
				}
			}
		})
	}
}
