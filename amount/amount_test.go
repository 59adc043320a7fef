package amount_test

import (
	"errors"
	"testing"

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
