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

// NotFoundError says that something a caller named does not exist. Err is
// the domain package's sentinel, which errors.Is matches through it;
// Detail says what is missing as the caller reads it, worded `no alert
// "nope"`, without a package's prefix: the REST API answers it as the
// 404's detail, while Error (for logs) keeps the sentinel's text.
type NotFoundError struct {
	Err    error
	Detail string
}

// NotFound returns a NotFoundError of sentinel with a formatted detail.
func NotFound(sentinel error, format string, args ...any) *NotFoundError {
	return &NotFoundError{Err: sentinel, Detail: fmt.Sprintf(format, args...)}
}

func (e *NotFoundError) Error() string { return e.Err.Error() + ": " + e.Detail }

func (e *NotFoundError) Unwrap() error { return e.Err }
