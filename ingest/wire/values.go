package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
)

// Field parsers. raw is the field's JSON value, nil when absent.

const missing = "is missing"

// stringField returns the unescaped bytes of a JSON string; bad names the
// reason for a string that cannot be unescaped (an unpaired surrogate).
func stringField(raw []byte, bad Reason) ([]byte, problem) {
	switch {
	case raw == nil:
		return nil, problem{ReasonMissingField, missing}
	case raw[0] != '"':
		return nil, problem{ReasonWrongType, mustBe("a string", raw)}
	}
	s, detail := unquote(raw)
	if detail != "" {
		return nil, problem{bad, clipRaw(raw) + " " + detail}
	}
	return s, problem{}
}

func parseUUID(raw []byte) (uuid.UUID, problem) {
	s, p := stringField(raw, ReasonBadUUID)
	if !p.ok() {
		return uuid.Nil, p
	}
	var u uuid.UUID
	var err error
	if len(s) == 36 { // uuid.ParseBytes also takes 32 hex digits, braces and urn: forms
		u, err = uuid.ParseBytes(s)
	}
	switch {
	case len(s) != 36 || err != nil:
		return uuid.Nil, problem{ReasonBadUUID, quote(string(s)) + " is not a UUID in the 8-4-4-4-12 hex form"}
	case u == uuid.Nil:
		return uuid.Nil, problem{ReasonBadUUID, quote(string(s)) + " is the nil UUID"}
	}
	return u, problem{}
}

// parseInt reads epoch or seq: a JSON integer >= 1 that fits in an int64.
func parseInt(raw []byte, bad Reason) (int64, problem) {
	if raw == nil {
		return 0, problem{ReasonMissingField, missing}
	}
	if c := raw[0]; c != '-' && (c < '0' || c > '9') {
		return 0, problem{ReasonWrongType, mustBe("an integer", raw)}
	}
	if bytes.ContainsAny(raw, ".eE") {
		return 0, problem{bad, clipRaw(raw) + " is not an integer"}
	}
	var v int64
	if raw[0] != '-' {
		for _, c := range raw {
			if v > (1<<63-1-int64(c-'0'))/10 {
				return 0, problem{bad, clipRaw(raw) + " does not fit in a 64-bit integer"}
			}
			v = v*10 + int64(c-'0')
		}
	}
	if v < 1 {
		if bad == ReasonBadEpoch {
			return 0, problem{bad, clipRaw(raw) + " is not positive; epochs start at 1"}
		}
		return 0, problem{bad, seqBelowOne(clipRaw(raw))}
	}
	return v, problem{}
}

func isNull(raw []byte) bool { return raw[0] == 'n' }

// kind names the JSON type of a value.
func kind(raw []byte) string {
	switch raw[0] {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

// mustBe describes a value of the wrong JSON type, showing scalars.
func mustBe(want string, raw []byte) string {
	got := kind(raw)
	switch got {
	case "object", "array", "null":
		return "must be " + want + ", got " + got
	}
	return "must be " + want + ", got " + got + " " + clipRaw(raw)
}

func repeated(at int) string {
	return fmt.Sprintf("key appears twice (again at offset %d); repeated keys are ambiguous", at)
}

// syntaxDetail explains why value is not JSON, with encoding/json's offset.
func syntaxDetail(value []byte) string {
	var raw json.RawMessage
	err := json.Unmarshal(value, &raw)
	if se := (*json.SyntaxError)(nil); errors.As(err, &se) {
		return fmt.Sprintf("invalid JSON at offset %d: %s", se.Offset, se.Error())
	}
	return "invalid JSON"
}
