package wire

import (
	"bytes"
	"unicode/utf16"
	"unicode/utf8"
)

// The JSON scanner (see the package doc for why Decode has its own):
// unquoting and skipping white space; valid.go finds where values end.

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

// keyName returns a member's key (raw, with its quotes) unescaped. A key
// that cannot be unescaped comes back raw; it matches no field name and is
// reported as unknown.
func keyName(raw []byte) []byte {
	s, detail := unquote(raw)
	if detail != "" {
		return raw[1 : len(raw)-1]
	}
	return s
}
