package wire

import (
	"strconv"
	"testing"

	"github.com/tally-ledger/tally/amount"
)

// TestSmallDecimalIsParseDecimal checks that the fast path of parseDecimal
// gives exactly what the general path gives (coefficient and exponent, so
// "1.50" keeps its scale), and leaves every other value to it.
func TestSmallDecimalIsParseDecimal(t *testing.T) {
	taken := 0
	for _, s := range []string{`0`, `7`, `"0"`, `"0.0"`, `"12"`, `"12.5"`, `"1.50"`, `"00012.50"`, `"0.000000001"`,
		`"0.0000000010"`, `"1.5000000000"`, `"999999999999999999"`, `"9999999999999999999"`, `"123456789.123456789"`,
		`"1234567890.123456789"`, `999999999999999999`, `1000000000000000000`, `"-1"`, `-1`, `"+1"`, `".5"`, `"5."`,
		`"1.2.3"`, `""`, `"\u0031"`, `" 1"`, `"1 "`, `1.5`, `1e3`, `"1e3"`, `"NaN"`, `"١"`} {
		raw := []byte(s)
		fast, ok := smallDecimal(raw)
		if !ok {
			continue
		}
		taken++
		text := s
		if s[0] == '"' {
			text, _ = strconv.Unquote(s)
		}
		want, err := amount.ParseNonNegative(text)
		if err != nil {
			t.Fatalf("%s: the fast path took a value the general path refuses: %v", s, err)
		}
		if fast.Coefficient().Cmp(want.Coefficient()) != 0 || fast.Exponent() != want.Exponent() {
			t.Fatalf("%s: fast %s×10^%d, general %s×10^%d", s, fast.Coefficient(), fast.Exponent(), want.Coefficient(), want.Exponent())
		}
		if got, p := parseDecimal(raw); !p.ok() || got.String() != want.String() {
			t.Fatalf("%s: parseDecimal %s %v", s, got, p)
		}
	}
	if taken != 12 {
		t.Fatalf("the fast path took %d values, want 12", taken)
	}
}
