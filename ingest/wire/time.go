package wire

import "time"

// parseTime reads occurred_at or sent_at: a JSON string in strict RFC 3339,
// in the range rangeProblem accepts (timeRangeProblem,
// occurredRangeProblem).
func parseTime(raw []byte, rangeProblem func(time.Time) string) (time.Time, problem) {
	s, p := stringField(raw, ReasonBadTimestamp)
	if !p.ok() {
		return time.Time{}, p
	}
	t, ok := parseRFC3339(s)
	if !ok {
		return time.Time{}, problem{ReasonBadTimestamp, quote(string(s)) +
			` is not an RFC 3339 timestamp with a zone, like "2026-12-02T10:00:00Z"`}
	}
	if d := rangeProblem(t); d != "" {
		return time.Time{}, problem{ReasonBadTimestamp, quote(string(s)) + d}
	}
	return t, problem{}
}

// parseRFC3339 reads YYYY-MM-DDTHH:MM:SS[.F](Z|±HH:MM) with 1 to 9
// fractional digits and returns the instant in UTC. It is stricter than
// time.Parse, which accepts one-digit hours, a comma before the fraction
// and more than nine fractional digits (silently truncated).
func parseRFC3339(b []byte) (time.Time, bool) {
	if len(b) < len("2006-01-02T15:04:05Z") {
		return time.Time{}, false
	}
	year, ok1 := digits(b[0:4])
	month, ok2 := digits(b[5:7])
	day, ok3 := digits(b[8:10])
	hour, ok4 := digits(b[11:13])
	minute, ok5 := digits(b[14:16])
	sec, ok6 := digits(b[17:19])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) ||
		b[4] != '-' || b[7] != '-' || (b[10] != 'T' && b[10] != 't') || b[13] != ':' || b[16] != ':' ||
		month < 1 || month > 12 || day < 1 || day > daysIn(month, year) ||
		hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	i, nsec := 19, 0
	if b[i] == '.' {
		j := i + 1
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
		n := j - i - 1
		if n < 1 || n > 9 {
			return time.Time{}, false
		}
		nsec, _ = digits(b[i+1 : j])
		for ; n < 9; n++ {
			nsec *= 10
		}
		i = j
	}
	offset := 0
	switch z := b[i:]; {
	case len(z) == 1 && (z[0] == 'Z' || z[0] == 'z'):
	case len(z) == 6 && (z[0] == '+' || z[0] == '-') && z[3] == ':':
		hh, ok1 := digits(z[1:3])
		mm, ok2 := digits(z[4:6])
		if !ok1 || !ok2 || hh > 23 || mm > 59 {
			return time.Time{}, false
		}
		offset = hh*3600 + mm*60
		if z[0] == '-' {
			offset = -offset
		}
	default:
		return time.Time{}, false
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	return t.Add(-time.Duration(offset) * time.Second), true
}

func digits(b []byte) (int, bool) {
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

func daysIn(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}
