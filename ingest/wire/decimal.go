package wire

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/amount"
)

// parseDecimal reads a total or quantity: an exact decimal >= 0 as a JSON
// string, or a JSON integer.
func parseDecimal(raw []byte) (decimal.Decimal, problem) {
	if raw == nil {
		return decimal.Decimal{}, problem{ReasonMissingField, missing}
	}
	if d, ok := smallDecimal(raw); ok {
		return d, problem{}
	}
	var text string
	switch c := raw[0]; {
	case c == '"':
		s, detail := unquote(raw)
		if detail != "" {
			return decimal.Decimal{}, problem{ReasonBadDecimal, clipRaw(raw) + " " + detail}
		}
		text = string(s)
	case c == '-' || c >= '0' && c <= '9':
		if bytes.ContainsAny(raw, ".eE") {
			return decimal.Decimal{}, problem{ReasonBadDecimal, clipRaw(raw) +
				` is a JSON number with a fraction or exponent; send exact decimals as strings, like "12.5"`}
		}
		text = string(raw)
	default:
		return decimal.Decimal{}, problem{ReasonWrongType, mustBe(`a decimal string such as "12.5"`, raw)}
	}
	d, err := amount.ParseNonNegative(text)
	if err == nil {
		return d, problem{}
	}
	shown := clipRaw(raw) // a JSON number as sent, a string quoted
	if raw[0] == '"' {
		shown = quote(text)
	}
	switch {
	case len(text) > maxDecimalText && plainDecimal(text):
		// amount.Parse refuses such text as a syntax error; it is a
		// well-formed number that is too long.
		return decimal.Decimal{}, problem{ReasonDecimalOutOfRange,
			fmt.Sprintf("%s is %d characters long; at most %d", shown, len(text), maxDecimalText)}
	case errors.Is(err, amount.ErrNegative):
		return decimal.Decimal{}, problem{ReasonNegative, shown + " is negative; totals and quantities are never below zero"}
	case errors.Is(err, amount.ErrScale):
		return decimal.Decimal{}, problem{ReasonDecimalOutOfRange, shown + " has " + amount.ErrScale.Error()}
	case errors.Is(err, amount.ErrDigits):
		return decimal.Decimal{}, problem{ReasonDecimalOutOfRange, shown + " has " + amount.ErrDigits.Error()}
	default:
		return decimal.Decimal{}, problem{ReasonBadDecimal, shown + " is not a decimal number"}
	}
}

// maxDecimalText is the longest text amount.Parse reads.
const maxDecimalText = 80

// plainDecimal reports whether s has the form -?[0-9]+(\.[0-9]+)?, whatever its length.
func plainDecimal(s string) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	digits, frac, dot := 0, 0, false
	for ; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9' && dot:
			frac++
		case c >= '0' && c <= '9':
			digits++
		case c == '.' && !dot && digits > 0:
			dot = true
		default:
			return false
		}
	}
	return digits > 0 && (!dot || frac > 0)
}

// smallDecimal reads the common case without building a string or going
// through big.Int parsing: a JSON integer, or a JSON string of the form
// [0-9]+(\.[0-9]+)?, of at most 18 digits with at most amount.MaxScale
// after the point. Such a value is within every limit of amount.Check and
// the decimal is the one amount.ParseNonNegative returns for the same text
// (coefficient the digits, exponent minus the digits after the point);
// anything else is left to parseDecimal's general path (ok false).
func smallDecimal(raw []byte) (d decimal.Decimal, ok bool) {
	b := raw
	if b[0] == '"' {
		if len(b) < 3 || b[len(b)-1] != '"' {
			return d, false
		}
		b = b[1 : len(b)-1]
	}
	var v int64
	digits, frac, dot := 0, 0, -1
	for i, c := range b {
		switch {
		case c >= '0' && c <= '9':
			v = v*10 + int64(c-'0')
			digits++
			if dot >= 0 {
				frac++
			}
		case c == '.' && dot < 0 && i > 0 && raw[0] == '"':
			dot = i
		default:
			return d, false
		}
	}
	if digits == 0 || digits > 18 || frac > amount.MaxScale || dot == len(b)-1 {
		return d, false
	}
	if frac == 0 && v < int64(len(smallInts)) {
		return smallInts[v], true
	}
	return decimal.New(v, int32(-frac)), true
}

// smallInts are the decimals 0 to 1,023, shared: a decimal is immutable
// (every operation returns a new one), and most quantities are small
// integers, so most records then allocate one decimal fewer.
var smallInts = func() (d [1024]decimal.Decimal) {
	for i := range d {
		d[i] = decimal.New(int64(i), 0)
	}
	return d
}()
