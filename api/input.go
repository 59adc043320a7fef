package api

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/internal/ids"
	"github.com/tally-ledger/tally/quota"
)

// checkID returns a field problem for an id that is not valid. The value is
// quoted (and clipped) so control characters never reach a response raw.
func checkID(field, s string) error {
	if ids.Valid(s) {
		return nil
	}
	return invalidField(field, "%s is not %s", quote(s), ids.Rule)
}

func quote(s string) string { return fmt.Sprintf("%q", clip(s, 64)) }

// logClip bounds, in runes, what a log line records of a request's own
// input (its path): any client, signed in or not, can send a path of tens
// of kilobytes, and the access log has a line for nearly every request.
const logClip = 256

// clip is s as valid UTF-8, cut to n runes (the last three "...") when
// longer.
func clip(s string, n int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if utf8.RuneCountInString(s) > n {
		s = string([]rune(s)[:n-3]) + "..."
	}
	return s
}

// queryParams returns the query with every parameter appearing at most once
// and only the allowed ones: a misspelt parameter is an error, not silently
// the default.
func queryParams(r *http.Request, allowed ...string) (map[string]string, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, invalidField("query", "cannot parse the query string: %v", err)
	}
	out := make(map[string]string, len(q))
	var errs []FieldError
	for k, vs := range q {
		known := false
		for _, a := range allowed {
			known = known || a == k
		}
		switch {
		case !known:
			detail := "unknown query parameter; this route takes none"
			if len(allowed) > 0 {
				detail = "unknown query parameter; allowed: " + strings.Join(allowed, ", ")
			}
			errs = append(errs, FieldError{Field: k, Detail: detail})
		case len(vs) > 1:
			errs = append(errs, FieldError{Field: k, Detail: "given more than once"})
		default:
			out[k] = vs[0]
		}
	}
	if len(errs) > 0 {
		sortFieldErrors(errs)
		return nil, invalid(errs...)
	}
	return out, nil
}

// pathParams readies the route's path parameters for the handler, which
// reads them with chi.URLParam. chi routes on the escaped path when the
// request's differs from the default escaping (r.URL.RawPath), so that an
// escaped slash stays inside its parameter; its parameters are then
// percent-decoded here, once: demo%2Dacme is demo-acme, and demo%2Facme is
// "demo/acme", an invalid id, not another route. A parameter holding a NUL
// character (%00) is refused naming it: ids are checked by their handlers,
// but names (of alerts, webhooks, pools) reach Postgres as they are, whose
// text cannot hold one.
func pathParams(r *http.Request) error {
	rctx := chi.RouteContext(r.Context())
	if rctx == nil {
		return nil
	}
	ps := &rctx.URLParams
	var errs []FieldError
	for i, k := range ps.Keys {
		if k == "*" {
			continue
		}
		if r.URL.RawPath != "" {
			v, err := url.PathUnescape(ps.Values[i])
			if err != nil {
				errs = append(errs, FieldError{Field: k, Detail: quote(ps.Values[i]) + " is not percent-encoded correctly"})
				continue
			}
			ps.Values[i] = v
		}
		if strings.IndexByte(ps.Values[i], 0) >= 0 {
			errs = append(errs, FieldError{Field: k, Detail: nulDetail})
		}
	}
	if len(errs) > 0 {
		return invalid(errs...)
	}
	return nil
}

func sortFieldErrors(errs []FieldError) {
	for i := 1; i < len(errs); i++ {
		for j := i; j > 0 && errs[j].Field < errs[j-1].Field; j-- {
			errs[j], errs[j-1] = errs[j-1], errs[j]
		}
	}
}

// decodeJSON reads exactly one JSON object of type T from the body: the
// content type must be JSON, unknown and duplicate fields (checkBody),
// NUL characters and trailing data are refused, and the body is limited by
// the router's MaxBytesReader.
func decodeJSON(r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return &Problem{Type: TypeUnsupportedType, Title: "Unsupported media type", Status: http.StatusUnsupportedMediaType,
				Detail: fmt.Sprintf("Content-Type %s is not application/json (with curl: --json '{...}', or -H 'Content-Type: application/json')", quote(ct))}
		}
	}
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		return jsonProblem(err)
	}
	if err := checkBody(raw, v); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var typ *json.UnmarshalTypeError
		if errors.As(err, &typ) && typ.Field != "" {
			typ.Field = indexedField(raw, v, typ)
		}
		return jsonProblem(err)
	}
	var extra json.RawMessage
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
		return nil
	case err == nil:
		return malformed("the body has data after the JSON object")
	default:
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return err
		}
		return malformed("the body has data after the JSON object")
	}
}

// checkBody checks the body's JSON value against v's type before it is
// decoded, naming each field at fault by its JSON path (reason,
// thresholds[0].percent, members[1]):
//   - a key given twice in one object is a duplicate field (encoding/json
//     would take the last);
//   - a key of a struct that is not exactly one of its fields' JSON names
//     is an unknown field, also one that differs from a field only in case
//     (encoding/json would match it to the field);
//   - a string (or key) holding a NUL character (U+0000, "\u0000" in JSON)
//     is refused: no text column of Postgres can store one, and every
//     string of a body is text somewhere.
//
// Values whose type decodes itself (json.RawMessage, decimalInput, ...)
// have no fields to match; their objects are still checked for duplicate
// keys and their strings for NUL. A body that is not one well-formed JSON
// value is left to the decoder, which says what is wrong with it, as it
// does for a value of the wrong JSON type.
func checkBody(raw []byte, v any) error {
	c := bodyCheck{dec: json.NewDecoder(bytes.NewReader(raw))}
	c.dec.UseNumber()
	if err := c.value("", reflect.TypeOf(v)); err != nil || len(c.errs) == 0 {
		return nil // malformed (or empty): the decoder's error is the answer
	}
	return invalid(c.errs...)
}

type bodyCheck struct {
	dec  *json.Decoder
	errs []FieldError
	// visit, when set, is given each value walked: its path and where its
	// JSON text ends in the body (it begins after the previous one's end,
	// past separators and white space).
	visit func(path string, start, end int64)
}

const nulDetail = "contains a NUL character (\\u0000), which no text may hold"

func (c *bodyCheck) fail(path, detail string) {
	c.errs = append(c.errs, FieldError{Field: path, Detail: detail})
}

// value walks the next JSON value, at path, to be decoded into a t (nil:
// a type whose fields are not known).
func (c *bodyCheck) value(path string, t reflect.Type) error {
	t = fieldsType(t)
	if c.visit != nil {
		start := c.dec.InputOffset()
		defer func() { c.visit(path, start, c.dec.InputOffset()) }()
	}
	tok, err := c.dec.Token()
	if err != nil {
		return err
	}
	switch tok := tok.(type) {
	case string:
		if strings.IndexByte(tok, 0) >= 0 && path != "" {
			c.fail(path, nulDetail)
		}
	case json.Delim:
		switch tok {
		case '{':
			if err := c.object(path, t); err != nil {
				return err
			}
		case '[':
			var elem reflect.Type
			if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
				elem = t.Elem()
			}
			for i := 0; c.dec.More(); i++ {
				if err := c.value(fmt.Sprintf("%s[%d]", path, i), elem); err != nil {
					return err
				}
			}
		}
		if _, err := c.dec.Token(); err != nil { // the closing delimiter
			return err
		}
	}
	return nil
}

// object walks an object's members (its opening brace read) at path, to be
// decoded into a t.
func (c *bodyCheck) object(path string, t reflect.Type) error {
	var fields map[string]reflect.Type
	var elem reflect.Type
	if t != nil {
		switch t.Kind() {
		case reflect.Struct:
			fields = jsonFields(t)
		case reflect.Map:
			elem = t.Elem()
		}
	}
	seen := map[string]bool{}
	for c.dec.More() {
		tok, err := c.dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		name := key
		if strings.IndexByte(key, 0) >= 0 {
			name = strings.ReplaceAll(key, "\x00", `\u0000`)
		}
		kpath := joinPath(path, name)
		ft := elem
		switch {
		case seen[key]:
			c.fail(kpath, "duplicate field: give it once")
		case name != key:
			c.fail(kpath, "the name "+nulDetail)
		case fields != nil:
			var ok bool
			if ft, ok = fields[key]; !ok {
				c.fail(kpath, unknownField(key, fields))
				if err := c.dec.Decode(new(json.RawMessage)); err != nil { // its value is not looked at
					return err
				}
				continue
			}
		}
		seen[key] = true
		if err := c.value(kpath, ft); err != nil {
			return err
		}
	}
	return nil
}

// unknownField is the detail for key, which is not one of fields.
func unknownField(key string, fields map[string]reflect.Type) string {
	for f := range fields {
		if strings.EqualFold(f, key) {
			return fmt.Sprintf("unknown field (names are case-sensitive: %s)", quote(f))
		}
	}
	return "unknown field"
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// fieldsType is t with pointers removed, or nil when t's JSON fields are
// not known: an interface, or a type that decodes itself.
func fieldsType(t reflect.Type) reflect.Type {
	if t == nil {
		return nil
	}
	if v, ok := fieldsTypeCache.Load(t); ok {
		ft, _ := v.(reflect.Type) // nil stored as nil
		return ft
	}
	ft := findFieldsType(t)
	fieldsTypeCache.Store(t, ft)
	return ft
}

// fieldsTypeCache holds fieldsType's answers: asking a type whether it
// implements an interface walks its methods, a third of a body's check
// when asked at every value.
var fieldsTypeCache sync.Map // reflect.Type → reflect.Type, or nil

func findFieldsType(t reflect.Type) reflect.Type {
	for t != nil {
		if t.Kind() == reflect.Interface || t.Implements(jsonUnmarshaler) || t.Implements(textUnmarshaler) {
			return nil
		}
		if t.Kind() != reflect.Pointer {
			if reflect.PointerTo(t).Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(textUnmarshaler) {
				return nil
			}
			return t
		}
		t = t.Elem()
	}
	return nil
}

var fieldCache sync.Map // reflect.Type → map[string]reflect.Type

// jsonFields is the struct type t's fields by JSON name, as encoding/json
// names them: the tag's name, else the Go name; "-" left out; an untagged
// embedded struct's fields promoted unless a shallower field has the name.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	if m, ok := fieldCache.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	out := map[string]reflect.Type{}
	for level := []reflect.Type{t}; len(level) > 0; {
		var next []reflect.Type
		found := map[string]reflect.Type{}
		for _, st := range level {
			for i := range st.NumField() {
				sf := st.Field(i)
				tag := sf.Tag.Get("json")
				if tag == "-" {
					continue
				}
				name, _, _ := strings.Cut(tag, ",")
				ft := sf.Type
				if ft.Kind() == reflect.Pointer {
					ft = ft.Elem()
				}
				if sf.Anonymous && name == "" && ft.Kind() == reflect.Struct {
					next = append(next, ft)
					continue
				}
				if !sf.IsExported() {
					continue
				}
				if name == "" {
					name = sf.Name
				}
				if _, ok := out[name]; !ok {
					found[name] = sf.Type
				}
			}
		}
		for k, v := range found {
			out[k] = v
		}
		level = next
	}
	fieldCache.Store(t, out)
	return out
}

// indexedField is the JSON path, with its array indices, of the value typ
// is about: encoding/json names a field without them (thresholds.percent
// for thresholds[2].percent). It is the first value at that path whose JSON
// is what typ says it found: a kind ("string", "number 1.5") or, from the
// types that decode themselves, the value's text clipped as they clip it.
// When no value matches, typ's own field.
func indexedField(raw []byte, v any, typ *json.UnmarshalTypeError) string {
	found := ""
	c := bodyCheck{dec: json.NewDecoder(bytes.NewReader(raw))}
	c.dec.UseNumber()
	c.visit = func(path string, start, end int64) {
		if found != "" || indexRE.ReplaceAllString(path, "") != typ.Field {
			return
		}
		if text := bytes.TrimLeft(raw[start:end], " \t\r\n,:"); foundAs(typ.Value, text) {
			found = path
		}
	}
	_ = c.value("", reflect.TypeOf(v)) // a body the decoder read to a type error is well-formed
	if found == "" {
		return typ.Field
	}
	return found
}

var indexRE = regexp.MustCompile(`\[[0-9]+\]`)

// foundAs reports whether the JSON text is the value a type error
// described as found.
func foundAs(found string, text []byte) bool {
	if len(text) == 0 {
		return false
	}
	if n, ok := strings.CutPrefix(found, "number "); ok {
		return string(text) == n
	}
	kind := map[byte]string{'"': "string", '{': "object", '[': "array", 't': "bool", 'f': "bool", 'n': "null"}[text[0]]
	if kind == "" {
		kind = "number"
	}
	switch found {
	case "string", "object", "array", "bool", "number":
		return kind == found
	}
	return clip(string(text), 40) == found
}

// joinPath is the JSON path of member key of the object at path.
func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func jsonProblem(err error) error {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var mb *http.MaxBytesError
	switch {
	case errors.As(err, &mb):
		return err
	case errors.Is(err, io.EOF):
		return malformed("the body is empty; a JSON object is required")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return malformed("the JSON body ends too early (truncated?)")
	case errors.As(err, &syntax):
		return malformed(fmt.Sprintf("invalid JSON at byte %d: %s", syntax.Offset, strings.TrimPrefix(syntax.Error(), "json: ")))
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			return malformed(fmt.Sprintf("the body must be a JSON object, not %s", typ.Value))
		}
		if typ.Value == "null" {
			return invalidField(field, "is required: %s, not null", jsonTypeName(typ.Type))
		}
		return invalidField(field, "must be %s, not %s", jsonTypeName(typ.Type), typ.Value)
	}
	// encoding/json has no error type for an unknown field (DisallowUnknownFields
	// reports it as text only); this is the one message matched, and it is
	// the standard library's, not one of Tally's errors.
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return invalidField(strings.Trim(f, `"`), "unknown field")
	}
	return malformed(strings.TrimPrefix(err.Error(), "json: "))
}

// decimalRule describes the one rule of decimals (parseDecimal).
var decimalRule = fmt.Sprintf(`an exact decimal string like "12.5" or "-3" (no exponent, "+" or bare point; at most %d digits after the point, %d in all)`,
	amount.MaxScale, amount.MaxDigits)

func jsonTypeName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t {
	case reflect.TypeFor[decimalInput](), reflect.TypeFor[nullDecimalInput]():
		return decimalRule
	case reflect.TypeFor[durationInput]():
		return `a duration like "30s", or whole seconds`
	case reflect.TypeFor[timeInput]():
		return "an RFC 3339 time"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer in range"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Bool:
		return "a boolean"
	}
	return t.String()
}

// Values of request bodies whose JSON form has a syntax of its own: a bad
// one is refused as invalid input naming its field. The types' own
// UnmarshalJSON errors say nothing of where the value was, so each is
// turned into the json.UnmarshalTypeError that encoding/json names the
// field of (jsonProblem).
type (
	decimalInput     struct{ decimal.Decimal }
	nullDecimalInput struct{ decimal.NullDecimal }
	durationInput    struct{ quota.Duration }
	timeInput        struct{ time.Time }
)

// A decimal's one rule is the adjustments' quantity's (amount.Parse): a
// JSON string of a plain decimal, "12", "0.5", "-3.25" (no exponent, "+",
// bare point, spaces or JSON number), at most amount.MaxScale digits after
// the point and amount.MaxDigits in all. A decimalInput is required: null
// is refused as a value left out (it was read as 0). An optional one is a
// *decimalInput, which null leaves nil without calling this.
func (d *decimalInput) UnmarshalJSON(b []byte) error {
	v, err := parseDecimal(b)
	if err != nil {
		return typed(err, b, d)
	}
	d.Decimal = v
	return nil
}

func (d *nullDecimalInput) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		d.NullDecimal = decimal.NullDecimal{}
		return nil
	}
	v, err := parseDecimal(b)
	if err != nil {
		return typed(err, b, d)
	}
	d.NullDecimal = decimal.NewNullDecimal(v)
	return nil
}

// parseDecimal reads the JSON value b by the one rule.
func parseDecimal(b []byte) (decimal.Decimal, error) {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return decimal.Decimal{}, err // not a string
	}
	return amount.Parse(s)
}

// UnmarshalJSON reads null as the field left out (the convention of
// json.Unmarshaler): every duration of a body is optional.
func (d *durationInput) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	return typed(d.Duration.UnmarshalJSON(b), b, d)
}
func (t *timeInput) UnmarshalJSON(b []byte) error { return typed(t.Time.UnmarshalJSON(b), b, t) }

// given is the optional duration given in field, or 0 when none was (nil:
// left out or null), which the packages take for their default. Zero
// given is refused, with rule (the field's range) as the detail: it would
// read as if the field were left out.
func (d *durationInput) given(field, rule string) (time.Duration, *Problem) {
	switch {
	case d == nil:
		return 0, nil
	case d.Duration == 0:
		return 0, invalidField(field, "0s must be %s; leave %s out (or null) for the default", rule, field)
	}
	return time.Duration(d.Duration), nil
}

// instant is the optional instant given in field, or the zero time when
// none was (which the packages take for now). The zero time given is
// refused: it would read as if the field were left out.
func (t *timeInput) instant(field string) (time.Time, error) {
	switch {
	case t == nil:
		return time.Time{}, nil
	case t.IsZero():
		return time.Time{}, invalidField(field, "%s", quota.ErrZeroTime)
	}
	return t.Time, nil
}

// ptr is the decimal given, or nil when none was.
func (d *decimalInput) ptr() *decimal.Decimal {
	if d == nil {
		return nil
	}
	return &d.Decimal
}

// typed is err, the parse error of the JSON value b into v, as a
// json.UnmarshalTypeError (the value clipped: it is quoted back).
func typed(err error, b []byte, v any) error {
	if err == nil {
		return nil
	}
	return &json.UnmarshalTypeError{Value: clip(string(b), 40), Type: reflect.TypeOf(v)}
}

// writeJSON writes v with the given status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	writeJSONWith(w, status, v, "")
}

var contentTypeJSON = []string{"application/json"}

// writeJSONWith is writeJSON of v, with, unless name is "", one more
// member added to v's object: name, whose value is the concatenation of
// parts, JSON encoded in advance and written as it is.
func writeJSONWith(w http.ResponseWriter, status int, v any, name string, parts ...[]byte) {
	buf := buffers.Get().(*bytes.Buffer)
	defer putBuffer(buf)
	err := encode(buf, v)
	if b := buf.Bytes(); err == nil && name != "" {
		if !bytes.HasSuffix(b, []byte("}\n")) {
			err = errors.New("not an object")
		} else {
			buf.Truncate(len(b) - 2)
			if len(b) > 3 { // v has members
				buf.WriteByte(',')
			}
			buf.WriteString(strconv.Quote(name))
			buf.WriteByte(':')
			for _, p := range parts {
				buf.Write(p)
			}
			buf.WriteString("}\n")
		}
	}
	if err != nil {
		writeProblem(w, &Problem{Type: TypeInternal, Title: "Internal error", Status: 500, Detail: "cannot encode the response"})
		return
	}
	w.Header()["Content-Type"] = contentTypeJSON // shared: net/http never modifies it
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// buffers holds response buffers: a usage answer is a few kilobytes, and
// growing a new buffer for each was much of the API's garbage.
var buffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func putBuffer(b *bytes.Buffer) {
	if b.Cap() <= 1<<20 { // an unusually large answer is not kept
		b.Reset()
		buffers.Put(b)
	}
}

// encode writes v to buf as JSON without HTML escaping ("<" stays "<" in
// details), ending in a newline.
func encode(buf *bytes.Buffer, v any) error {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}
