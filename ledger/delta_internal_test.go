package ledger

import (
	"math/rand/v2"
	"testing"

	"github.com/shopspring/decimal"
)

// TestDeltaIsExactlyTheSubtraction compares deltaOf with Decimal.Sub in
// value and exponent (the exponent is the scale the delta is stored with)
// on totals and quantities of mixed scales and sizes, up to past what an
// int64 holds: a quantity that equals the delta, one that equals it at
// another scale, one that is off by one unit, and none.
func TestDeltaIsExactlyTheSubtraction(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	coefficient := func() int64 {
		switch rng.IntN(4) {
		case 0:
			return rng.Int64N(1000)
		case 1:
			return rng.Int64N(1_000_000_000_000_000_000) // 18 or fewer digits
		default:
			return rng.Int64N(10_000_000)
		}
	}
	dec := func() decimal.Decimal { return decimal.New(coefficient(), -int32(rng.IntN(7))) }
	for range 200_000 {
		last := dec()
		total := last.Add(dec())
		huge := decimal.RequireFromString("123456789012345678901234567890")
		switch rng.IntN(8) { // beyond int64 coefficients
		case 0: // the total
			total = total.Add(huge)
		case 1: // both, their difference small
			last, total = last.Add(huge), total.Add(huge)
		}
		want := total.Sub(last)
		var q decimal.NullDecimal
		switch rng.IntN(5) {
		case 0:
		case 1:
			q = decimal.NewNullDecimal(want.Add(decimal.New(1, want.Exponent())))
		case 2:
			q = decimal.NewNullDecimal(decimal.New(0, want.Exponent()-1).Add(want)) // one more digit of scale
		default:
			q = decimal.NewNullDecimal(want)
		}
		got := deltaOf(total, last, q)
		if !got.Equal(want) || got.Exponent() != want.Exponent() {
			t.Fatalf("deltaOf(%s, %s, %v) = %s (exponent %d); Sub gives %s (exponent %d)",
				total, last, q, got, got.Exponent(), want, want.Exponent())
		}
	}
}
