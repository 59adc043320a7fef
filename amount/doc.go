// Package amount parses and checks the exact decimal quantities Tally bills.
//
// Every quantity and running total in Tally is a decimal.Decimal with at
// most 38 significant digits and at most 9 digits after the point, stored in
// Postgres as NUMERIC. A value outside that is bad input and is
// rejected with an error; it is never rounded. Floats never appear.
package amount
