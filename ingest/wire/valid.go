package wire

// valid reports whether d is one JSON value (RFC 8259) with optional
// surrounding whitespace: exactly what encoding/json.Valid accepts (no
// UTF-8 check inside strings, nesting at most 10,000 deep), which
// FuzzValid checks byte for byte. It is a plain loop over the bytes:
// encoding/json's scanner calls a state function per byte, which made
// validation over a third of decoding's time.
func valid(d []byte) bool {
	i := skipSpace(d, 0)
	// stack holds the open containers, '{' or '['.
	var stackArr [64]byte
	stack := stackArr[:0]
	for {
		// A value starts at d[i].
		if i >= len(d) {
			return false
		}
		switch c := d[i]; c {
		case '{', '[':
			if len(stack) == maxNesting {
				return false
			}
			stack = append(stack, c)
			i = skipSpace(d, i+1)
			if i >= len(d) {
				return false
			}
			if c == '{' {
				if d[i] == '}' {
					stack = stack[:len(stack)-1]
					i++
					break
				}
				if i = validKey(d, i); i < 0 {
					return false
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
				return false
			}
		case 't':
			if i = validLiteral(d, i, "true"); i < 0 {
				return false
			}
		case 'f':
			if i = validLiteral(d, i, "false"); i < 0 {
				return false
			}
		case 'n':
			if i = validLiteral(d, i, "null"); i < 0 {
				return false
			}
		default:
			if i = validNumber(d, i); i < 0 {
				return false
			}
		}
		// A value ended just before d[i]: close containers or go on to the
		// next element or member.
		for {
			i = skipSpace(d, i)
			if len(stack) == 0 {
				return i == len(d)
			}
			if i >= len(d) {
				return false
			}
			top := stack[len(stack)-1]
			c := d[i]
			if c == ',' {
				i = skipSpace(d, i+1)
				if top == '{' {
					if i = validKey(d, i); i < 0 {
						return false
					}
				}
				break
			}
			if (top == '{' && c == '}') || (top == '[' && c == ']') {
				stack = stack[:len(stack)-1]
				i++
				continue
			}
			return false
		}
	}
}

// maxNesting is encoding/json's limit on nested objects and arrays.
const maxNesting = 10000

// validKey reads a member's key and its colon at d[i] and returns the
// offset of its value, or -1.
func validKey(d []byte, i int) int {
	if i >= len(d) || d[i] != '"' {
		return -1
	}
	if i = validString(d, i); i < 0 {
		return -1
	}
	i = skipSpace(d, i)
	if i >= len(d) || d[i] != ':' {
		return -1
	}
	return skipSpace(d, i+1)
}

// validString returns the offset just past the string at d[i], or -1.
func validString(d []byte, i int) int {
	for i++; i < len(d); {
		// Most of a message is plain string bytes: skip them in a tight loop.
		for i < len(d) && plainStringByte[d[i]] {
			i++
		}
		if i >= len(d) {
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
