package console

import (
	"testing"

	"github.com/shopspring/decimal"
)

func TestNumGroupsThousandsAndKeepsEveryDigit(t *testing.T) {
	for in, want := range map[string]string{
		"0":                        "0",
		"999":                      "999",
		"1000":                     "1,000",
		"1234567":                  "1,234,567",
		"-1234567.891":             "-1,234,567.891",
		"1000.000000000000000001":  "1,000.000000000000000001",
		"123456789012345678901234": "123,456,789,012,345,678,901,234",
		"0.5":                      "0.5",
		"-999.5":                   "-999.5",
	} {
		if got := num(decimal.RequireFromString(in)); got != want {
			t.Errorf("num(%s) = %q, want %q", in, got, want)
		}
	}
	if got := num(int64(-1000)); got != "-1,000" {
		t.Errorf("num(int64 -1000) = %q", got)
	}
	if got := num(decimal.NullDecimal{}); got != "—" {
		t.Errorf("num(null) = %q", got)
	}
}
