package wire

import (
	"encoding/binary"
	"math/bits"
)

// valid reports whether d is one JSON value (RFC 8259) with optional
// surrounding whitespace: exactly what encoding/json.Valid accepts (no
// UTF-8 check inside strings, nesting at most 10,000 deep), which
// FuzzValid checks byte for byte.
func valid(d []byte) bool {
	i := validValue(d, skipSpace(d, 0), 0)
	return i >= 0 && skipSpace(d, i) == len(d)
}

// validValue returns the offset just past the JSON value that starts at
// d[i], or -1 if there is none there: a syntax error, or nesting deeper
// than maxNesting counting the depth containers the value lies in. It is a
// plain loop over the bytes: encoding/json's scanner calls a state function
// per byte, which made validation over a third of decoding's time. Decode
// reads the message with it, so a message is checked as it is read.
func validValue(d []byte, i, depth int) int {
	if i >= len(d) {
		return -1
	}
	switch d[i] {
	case '"':
		return validString(d, i)
	case '{', '[':
	default:
		return validScalar(d, i)
	}
	// stack holds the open containers, '{' or '['.
	var stackArr [64]byte
	stack := stackArr[:0]
	for {
		// A value starts at d[i].
		if i >= len(d) {
			return -1
		}
		switch c := d[i]; c {
		case '{', '[':
			if depth+len(stack) == maxNesting {
				return -1
			}
			stack = append(stack, c)
			i = skipSpace(d, i+1)
			if i >= len(d) {
				return -1
			}
			if c == '{' {
				if d[i] == '}' {
					stack = stack[:len(stack)-1]
					i++
					break
				}
				if _, i = validKey(d, i); i < 0 {
					return -1
				}
				continue
			}
			if d[i] == ']' {
				stack = stack[:len(stack)-1]
				i++
				break
			}
			continue
		case '"':
			if i = validString(d, i); i < 0 {
				return -1
			}
		default:
			if i = validScalar(d, i); i < 0 {
				return -1
			}
		}
		// A value ended just before d[i]: close containers or go on to the
		// next element or member.
		for {
			if len(stack) == 0 {
				return i
			}
			i = skipSpace(d, i)
			if i >= len(d) {
				return -1
			}
			top := stack[len(stack)-1]
			c := d[i]
			if c == ',' {
				i = skipSpace(d, i+1)
				if top == '{' {
					if _, i = validKey(d, i); i < 0 {
						return -1
					}
				}
				break
			}
			if (top == '{' && c == '}') || (top == '[' && c == ']') {
				stack = stack[:len(stack)-1]
				i++
				continue
			}
			return -1
		}
	}
}

// validScalar returns the offset just past the literal or number at d[i], or -1.
func validScalar(d []byte, i int) int {
	switch d[i] {
	case 't':
		return validLiteral(d, i, "true")
	case 'f':
		return validLiteral(d, i, "false")
	case 'n':
		return validLiteral(d, i, "null")
	}
	return validNumber(d, i)
}

// maxNesting is encoding/json's limit on nested objects and arrays.
const maxNesting = 10000

// validKey reads a member's key and its colon at d[i] and returns the
// offset just past the key and the offset of the member's value, or -1s.
func validKey(d []byte, i int) (keyEnd, val int) {
	if i >= len(d) || d[i] != '"' {
		return -1, -1
	}
	if keyEnd = validString(d, i); keyEnd < 0 {
		return -1, -1
	}
	i = skipSpace(d, keyEnd)
	if i >= len(d) || d[i] != ':' {
		return -1, -1
	}
	return keyEnd, skipSpace(d, i+1)
}

// validString returns the offset just past the string at d[i], or -1.
func validString(d []byte, i int) int {
	for i++; i < len(d); {
		if i = skipPlain(d, i); i >= len(d) {
			return -1
		}
		c := d[i]
		switch {
		case c == '"':
			return i + 1
		case c < 0x20:
			return -1
		case c == '\\':
			if i+1 >= len(d) {
				return -1
			}
			switch d[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(d) {
					return -1
				}
				for _, h := range d[i+2 : i+6] {
					if !isHex(h) {
						return -1
					}
				}
				i += 6
			default:
				return -1
			}
		default:
			i++
		}
	}
	return -1
}

// skipPlain returns the offset of the first byte at or after i that is
// not a plain string byte (plainStringByte), or len(d). Most of a message
// is plain string bytes: it skips them eight at a time up to the first
// that is not (the end of a string is mostly in the next word), then one
// at a time near the end of d.
func skipPlain(d []byte, i int) int {
	for i+8 <= len(d) {
		if m := specialBytes(binary.LittleEndian.Uint64(d[i:])); m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
		i += 8
	}
	for i < len(d) && plainStringByte[d[i]] {
		i++
	}
	return i
}

// specialBytes marks, in the high bit of each of the eight bytes of w
// (little-endian: byte 0 is d[i]), the bytes that are not plain string
// bytes (plainStringByte); the lowest mark is exactly the first such byte.
// (x-ones)&^x&highs marks the zero bytes of x, and (w-0x20 in each
// byte)&^w&highs the bytes below 0x20: a borrow runs into the next byte
// only from a marked one, so marks above the first may be spurious but the
// first is not; a quote or a backslash is a zero byte of w xor that byte
// repeated.
func specialBytes(w uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	q, b := w^(ones*'"'), w^(ones*'\\')
	return ((q-ones)&^q | (b-ones)&^b | (w-ones*0x20)&^w) & highs
}

// plainStringByte: the bytes a string holds as they are (not a quote, a
// backslash or a control character).
var plainStringByte = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func validLiteral(d []byte, i int, lit string) int {
	if len(d)-i < len(lit) || string(d[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}

// validNumber returns the offset just past the number at d[i], or -1:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func validNumber(d []byte, i int) int {
	if d[i] == '-' {
		i++
	}
	switch {
	case i >= len(d):
		return -1
	case d[i] == '0':
		i++
	case d[i] >= '1' && d[i] <= '9':
		i = digitsEnd(d, i+1)
	default:
		return -1
	}
	if i < len(d) && d[i] == '.' {
		j := digitsEnd(d, i+1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		j := digitsEnd(d, i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

func digitsEnd(d []byte, i int) int {
	for i < len(d) && d[i] >= '0' && d[i] <= '9' {
		i++
	}
	return i
}
