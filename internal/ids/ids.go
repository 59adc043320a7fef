// Package ids is the one rule of Tally's ids and names (docs/design.md §2):
// customer, meter, producer, holder and report ids are 1 to 128 characters
// of A-Z a-z 0-9 . _ : -; pool, alert and webhook names the same without
// ':'. Neither is "." or "..": those are path segments, so a URL holding one
// (/v1/customers/.., /console/customers/.) names its parent, and whatever
// carries it could be read or managed by no one.
package ids

// MaxLen is the longest id or name, in bytes (every allowed character is one).
const MaxLen = 128

// Rule and NameRule say the rules, for error messages.
const (
	Rule     = "1-128 characters of A-Z a-z 0-9 . _ : -, not . or .."
	NameRule = "1-128 characters of A-Z a-z 0-9 . _ -, not . or .."
)

// Valid reports whether s is an id.
func Valid(s string) bool { return valid(s, true) }

// ValidName reports whether s is a name (an id without ':').
func ValidName(s string) bool { return valid(s, false) }

func valid(s string, colon bool) bool {
	if len(s) == 0 || len(s) > MaxLen || s == "." || s == ".." {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		case c == ':' && colon:
		default:
			return false
		}
	}
	return true
}
