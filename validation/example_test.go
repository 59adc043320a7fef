package validation_test

import (
	"errors"
	"fmt"

	"github.com/tally-ledger/tally/validation"
)

func ExampleFields() {
	err := fmt.Errorf("quota: invalid input: %w", errors.Join(
		validation.Errorf("limit", "is required"),
		&validation.FieldError{Field: "mode", Detail: `"loud" must be "enforce" or "shadow"`},
	))
	for _, fe := range validation.Fields(err) {
		fmt.Printf("%s | %s\n", fe.Field, fe.Detail)
	}
	fmt.Println(validation.Fields(errors.New("connection refused")) == nil)
	// Output:
	// limit | is required
	// mode | "loud" must be "enforce" or "shadow"
	// true
}
