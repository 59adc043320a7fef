package amount_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/shopspring/decimal"
	"pgregory.net/rapid"

	"github.com/tally-ledger/tally/amount"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
		err  error
	}{
		{"0", "0", nil},
		{"3", "3", nil},
		{"-3.25", "-3.25", nil},
		{"1.000000000", "1", nil},
		{"0.000000001", "0.000000001", nil},
		{"1.5000000000000", "1.5", nil},
		{"12345678901234567890123456789012345678", "12345678901234567890123456789012345678", nil},
		{"12345678901234567890123456789.123456789", "12345678901234567890123456789.123456789", nil},
		{"123456789012345678901234567890.123456789", "", amount.ErrDigits},
		{"12345678901234567890123456789.123456789", "12345678901234567890123456789.123456789", nil},
		{"123456789012345678901234567890.123456789", "", amount.ErrDigits},
		{"0.0000000001", "", amount.ErrScale},
		{"1e3", "", amount.ErrSyntax},
		{"", "", amount.ErrSyntax},
		{" 1", "", amount.ErrSyntax},
		{"+1", "", amount.ErrSyntax},
		{".5", "", amount.ErrSyntax},
		{"5.", "", amount.ErrSyntax},
		{"1.2.3", "", amount.ErrSyntax},
		{"NaN", "", amount.ErrSyntax},
		{"١٢", "", amount.ErrSyntax},
	} {
		got, err := amount.Parse(tc.in)
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("Parse(%q) error = %v, want %v", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got.String() != tc.want {
			t.Errorf("Parse(%q) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	if _, err := amount.ParseNonNegative("-1"); !errors.Is(err, amount.ErrNegative) {
		t.Errorf("ParseNonNegative(-1) error = %v", err)
	}
}

// TestCheckMatchesTextRule: Check agrees with the rule stated on the text
// of the number (trailing fractional zeros dropped, then count).
func TestCheckMatchesTextRule(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		coef := rapid.SampledFrom([]string{"0", "1", "10", "1000", "123456789", "99999999999999999999", "12345678901234567890123456789012345678", "100000000000000000000000000000000000000"}).Draw(t, "coef")
		exp := rapid.IntRange(-12, 3).Draw(t, "exp")
		d, _ := decimal.NewFromString(coef + "e" + strconv.Itoa(exp))
		if rapid.Bool().Draw(t, "neg") {
			d = d.Neg()
		}
		// Reference: the text rule.
		txt := d.Abs().String() // no trailing fractional zeros, no exponent
		intPart, frac, _ := strings.Cut(txt, ".")
		digits := len(strings.TrimLeft(intPart+frac, "0"))
		var want error
		switch {
		case len(frac) > amount.MaxScale:
			want = amount.ErrScale
		case d.Sign() != 0 && digits > amount.MaxDigits:
			want = amount.ErrDigits
		}
		if got := amount.Check(d); !errors.Is(got, want) && !(got == nil && want == nil) {
			t.Fatalf("Check(%s) = %v, want %v", d, got, want)
		}
	})
}
