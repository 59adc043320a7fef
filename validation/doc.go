// Package validation is the shape of an input problem that Tally's domain
// packages (ledger, periods, quota, admission) return and the REST API turns
// into problem+json: a FieldError names the field at fault and says what is
// wrong with it, as data.
//
// Invariants:
//   - A validator reports every problem at once: errors.Join of
//     *FieldError, one per problem, in the order they were found.
//   - A *FieldError means "the caller's input is wrong". An error about
//     stored state is never a *FieldError and never wraps one, so nothing a
//     server holds is reported to a client as a bad request.
//   - Nobody parses an error's text to recover the field: Fields reads the
//     values.
//   - A NotFoundError says that what the caller named does not exist; its
//     Detail is worded for the caller (`no alert "nope"`), so no package's
//     prefix reaches a 404's detail.
package validation
