package amount

import (
	"errors"
	"fmt"
	"math/big"
	"strings"

	"github.com/shopspring/decimal"
)

// Limits of an exact quantity (docs/design.md §2).
const (
	MaxDigits = 38 // significant digits
	MaxScale  = 9  // digits after the point
)

// Errors returned by Parse and Check. Callers match them with errors.Is.
var (
	ErrSyntax   = errors.New("not a decimal number")
	ErrScale    = fmt.Errorf("more than %d digits after the point", MaxScale)
	ErrDigits   = fmt.Errorf("more than %d significant digits", MaxDigits)
	ErrNegative = errors.New("negative")
)

// Parse reads a plain decimal string such as "12", "0.5" or "-3.25".
// Exponents, spaces, "+" signs, leading dots and NaN/Inf are refused, so the
// text a producer sent is the number Tally bills.
func Parse(s string) (decimal.Decimal, error) {
	if !plain(s) {
		return decimal.Decimal{}, fmt.Errorf("%q: %w", clip(s), ErrSyntax)
	}
	d, err := decimal.NewFromString(s)
	if err != nil {
		return decimal.Decimal{}, fmt.Errorf("%q: %w", clip(s), ErrSyntax)
	}
	if err := Check(d); err != nil {
		return decimal.Decimal{}, fmt.Errorf("%q: %w", clip(s), err)
	}
	return d, nil
}

// ParseNonNegative is Parse for totals and quantities, which are never below zero.
func ParseNonNegative(s string) (decimal.Decimal, error) {
	d, err := Parse(s)
	if err != nil {
		return d, err
	}
	if d.Sign() < 0 {
		return decimal.Decimal{}, fmt.Errorf("%q: %w", clip(s), ErrNegative)
	}
	return d, nil
}

// Check reports whether d is within the limits: at most MaxScale digits
// after the point and at most MaxDigits significant digits. Trailing zeros
// after the point do not count (1.5000000000 is 1.5).
func Check(d decimal.Decimal) error {
	exp := int64(d.Exponent())
	if d.Sign() == 0 {
		return nil
	}
	var digits int64
	if d.NumDigits() <= 18 {
		// The common case, without big.Int arithmetic or allocation
		// (NumDigits and CoefficientInt64 read the coefficient in place).
		c := d.CoefficientInt64()
		if c < 0 {
			c = -c
		}
		for exp < 0 && c%10 == 0 {
			c /= 10
			exp++
		}
		for ; c > 0; c /= 10 {
			digits++
		}
	} else {
		c := new(big.Int).Abs(d.Coefficient())
		ten := big.NewInt(10)
		r := new(big.Int)
		for exp < 0 {
			q, m := new(big.Int).QuoRem(c, ten, r)
			if m.Sign() != 0 {
				break
			}
			c = q
			exp++
		}
		digits = int64(len(c.String()))
	}
	if exp < -MaxScale {
		return ErrScale
	}
	if exp > 0 {
		digits += exp
	}
	if digits > MaxDigits {
		return ErrDigits
	}
	return nil
}

// MustParse is Parse for constants in tests and examples; it panics on error.
func MustParse(s string) decimal.Decimal {
	d, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return d
}

func plain(s string) bool {
	if s == "" || len(s) > 80 {
		return false
	}
	i := 0
	if s[0] == '-' {
		i = 1
	}
	digits, dot := 0, false
	for ; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			digits++
		case c == '.' && !dot && digits > 0:
			dot = true
		default:
			return false
		}
	}
	return digits > 0 && !strings.HasSuffix(s, ".")
}

func clip(s string) string {
	if len(s) > 48 {
		return s[:45] + "..."
	}
	return s
}
