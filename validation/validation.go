package validation

import "fmt"

// FieldError is one problem with one input field. Field is the field's
// name as the caller wrote it (a JSON member, a query or path parameter,
// or a path into the input such as "schedule[1].effective_from"); Detail
// says what is wrong, without the field's name.
type FieldError struct {
	Field  string
	Detail string
}

// Errorf returns a FieldError for field with a formatted detail.
func Errorf(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Detail: fmt.Sprintf(format, args...)}
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Detail }

// Fields returns every FieldError in err's tree (errors.Join and %w
// wrapping, depth first, in order). It is nil when err holds none.
func Fields(err error) []FieldError {
	var out []FieldError
	var walk func(error)
	walk = func(e error) {
		switch x := e.(type) {
		case nil:
		case *FieldError:
			out = append(out, *x)
		case interface{ Unwrap() []error }:
			for _, c := range x.Unwrap() {
				walk(c)
			}
		case interface{ Unwrap() error }:
			walk(x.Unwrap())
		}
	}
	walk(err)
	return out
}
