package wire

import (
	"bytes"
	"unicode/utf16"
	"unicode/utf8"
)

// The JSON scanner (see the package doc for why Decode has its own):
// unquoting, skipping values, iterating over members and elements.

// unquote returns the content of the JSON string raw (quotes included). It
// fails on an escaped unpaired UTF-16 surrogate, which encoding/json would
// silently turn into U+FFFD; invalid UTF-8 bytes are passed through for the
// caller's rules to reject.
func unquote(raw []byte) ([]byte, string) {
	b := raw[1 : len(raw)-1]
	if bytes.IndexByte(b, '\\') < 0 {
		return b, ""
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); {
		c := b[i]
		if c != '\\' {
			out = append(out, c)
			i++
			continue
		}
		switch e := b[i+1]; e {
		case 'u':
			r := hex4(b[i+2 : i+6])
			i += 6
			if utf16.IsSurrogate(r) {
				if r < 0xdc00 && i+6 <= len(b) && b[i] == '\\' && b[i+1] == 'u' {
					if r2 := hex4(b[i+2 : i+6]); r2 >= 0xdc00 && r2 <= 0xdfff {
						out = utf8.AppendRune(out, utf16.DecodeRune(r, r2))
						i += 6
						continue
					}
				}
				return nil, "has an unpaired UTF-16 surrogate escape"
			}
			out = utf8.AppendRune(out, r)
			continue
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		default: // '"', '\\', '/'
			out = append(out, e)
		}
		i += 2
	}
	return out, ""
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

func skipSpace(d []byte, i int) int {
	for i < len(d) && (d[i] == ' ' || d[i] == '\t' || d[i] == '\n' || d[i] == '\r') {
		i++
	}
	return i
}

// endString returns the offset just past the string that starts at d[i].
func endString(d []byte, i int) int {
	j := i + 1
	for {
		q := j + bytes.IndexByte(d[j:], '"')
		n := 0
		for p := q - 1; p > i && d[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return q + 1
		}
		j = q + 1
	}
}

// endValue returns the offset just past the value that starts at d[i].
func endValue(d []byte, i int) int {
	switch d[i] {
	case '"':
		return endString(d, i)
	case '{', '[':
		depth := 0
		for i < len(d) {
			switch d[i] {
			case '"':
				i = endString(d, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i < len(d) {
		switch d[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

// members iterates over an object's members; i starts just past the '{'.
type members struct {
	d []byte
	i int
}

type member struct {
	key   []byte // raw, with quotes
	keyAt int    // offset of the key in the message
	val   []byte // raw value; nil for an absent member
	at    int    // offset of the value in the message
}

// name returns the key unescaped. A key that cannot be unescaped comes back
// raw; it matches no field name and is reported as unknown.
func (m member) name() []byte {
	s, detail := unquote(m.key)
	if detail != "" {
		return m.key[1 : len(m.key)-1]
	}
	return s
}

func (it *members) next() (member, bool) {
	d := it.d
	i := skipSpace(d, it.i)
	if d[i] == '}' {
		it.i = i + 1
		return member{}, false
	}
	if d[i] == ',' {
		i = skipSpace(d, i+1)
	}
	keyAt := i
	end := endString(d, i)
	i = skipSpace(d, end) // at ':'
	i = skipSpace(d, i+1) // at the value
	vend := endValue(d, i)
	it.i = vend
	return member{key: d[keyAt:end], keyAt: keyAt, val: d[i:vend], at: i}, true
}

// elems iterates over an array's elements; i starts just past the '['.
type elems struct {
	d []byte
	i int
}

func (it *elems) next() (val []byte, at int, ok bool) {
	d := it.d
	i := skipSpace(d, it.i)
	if d[i] == ']' {
		it.i = i + 1
		return nil, 0, false
	}
	if d[i] == ',' {
		i = skipSpace(d, i+1)
	}
	end := endValue(d, i)
	it.i = end
	return d[i:end], i, true
}
