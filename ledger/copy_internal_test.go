package ledger

import (
	"context"
	"strings"
	"testing"

	"github.com/tally-ledger/tally/internal/pgtest"
)

// TestCopyColumnTypes pins the types the ledger's own binary COPY encodes
// (copy.go) to the columns of records: a migration that changed one would
// otherwise be found only as Postgres refusing the bytes.
func TestCopyColumnTypes(t *testing.T) {
	pool := pgtest.New(t)
	want := []string{"int8", "int8", "uuid", "text", "text", "numeric", "numeric", "timestamptz",
		"bool", "bool", "numeric", "timestamptz", "timestamptz", "timestamptz", "timestamptz"}
	rows, err := pool.Query(context.Background(), `
SELECT c.name, coalesce(t.typname, '(no such column)')
FROM unnest($1::text[]) WITH ORDINALITY AS c(name, i)
LEFT JOIN pg_attribute a ON a.attrelid = 'records'::regclass AND a.attname = c.name AND NOT a.attisdropped
LEFT JOIN pg_type t ON t.oid = a.atttypid
ORDER BY c.i`, recordColumns)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			t.Fatal(err)
		}
		got = append(got, name+" "+typ)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		want[i] = recordColumns[i] + " " + want[i]
	}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Fatalf("records columns:\n got %v\nwant %v", got, want)
	}
	if want := "COPY records (" + strings.Join(recordColumns, ", ") + ") FROM STDIN BINARY"; qCopyRecords != want {
		t.Fatalf("qCopyRecords = %s, want the columns of recordColumns: %s", qCopyRecords, want)
	}
}
