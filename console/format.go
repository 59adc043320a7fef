package console

import (
	"fmt"
	"html/template"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/quota"
)

// funcs has no query escaper on purpose: html/template escapes a value
// in a URL's query itself, and escaping it first as well sent "tenant:42"
// as "tenant%253A42". In a path html/template leaves "%" alone, so pathEsc
// and customer escape once.
var funcs = template.FuncMap{
	"num":       num,
	"at":        at,
	"seconds":   seconds,
	"customer":  customerPath,
	"pathEsc":   url.PathEscape,
	"duration":  func(d quota.DurationText) string { return quota.FormatDuration(time.Duration(d)) },
	"add":       func(a, b int) int { return a + b },
	"truncated": truncated,
}

// num formats an exact quantity with thousands separators: 1234567.5 →
// "1,234,567.5". Digits are never rounded.
func num(v any) string {
	var s string
	switch x := v.(type) {
	case decimal.Decimal:
		s = x.String()
	case *decimal.Decimal:
		if x == nil {
			return "—"
		}
		s = x.String()
	case decimal.NullDecimal:
		if !x.Valid {
			return "—"
		}
		s = x.Decimal.String()
	case string:
		s = x
	case int:
		s = strconv.Itoa(x)
	case int64:
		s = strconv.FormatInt(x, 10)
	case int32:
		s = strconv.FormatInt(int64(x), 10)
	default:
		return fmt.Sprint(v)
	}
	return groupThousands(s)
}

// groupThousands puts a comma between every three digits of a decimal
// string's integer part.
func groupThousands(s string) string {
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	intPart, frac, hasFrac := strings.Cut(s, ".")
	var b strings.Builder
	b.WriteString(sign)
	for i, r := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if hasFrac {
		b.WriteByte('.')
		b.WriteString(frac)
	}
	return b.String()
}

// timeView is an instant shown in a zone, with its UTC form for hover and
// for machines.
type timeView struct {
	Local, UTC, ISO string
}

// at shows t (a time.Time or *time.Time; nil and zero are "never") in loc
// (nil: UTC).
func at(v any, loc *time.Location) timeView {
	var t time.Time
	switch x := v.(type) {
	case time.Time:
		t = x
	case *time.Time:
		if x != nil {
			t = *x
		}
	}
	if t.IsZero() {
		return timeView{Local: "never"}
	}
	if loc == nil {
		loc = time.UTC
	}
	u := t.UTC()
	return timeView{Local: t.In(loc).Format("2 Jan 2006 15:04:05 MST"), UTC: u.Format("2006-01-02 15:04:05 UTC"),
		ISO: u.Format(time.RFC3339Nano)}
}

// seconds shows a lag in seconds ("unknown" when nil).
func seconds(v any) string {
	var f float64
	switch x := v.(type) {
	case *float64:
		if x == nil {
			return "unknown"
		}
		f = *x
	case *quota.Seconds:
		if x == nil {
			return "unknown"
		}
		f = float64(*x) / 1000
	default:
		return fmt.Sprint(v)
	}
	return strconv.FormatFloat(f, 'f', 1, 64) + " s"
}

// truncated shortens s to n characters for a table cell (the whole is on
// the detail page).
func truncated(n int, s string) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}
