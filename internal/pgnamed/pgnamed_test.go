package pgnamed_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/internal/pgnamed"
)

func rewrite(t *testing.T, sql string, a pgnamed.Args) (string, []any) {
	t.Helper()
	got, args, err := a.RewriteQuery(context.Background(), nil, sql, nil)
	if err != nil {
		t.Fatal(err)
	}
	want, wantArgs, err := pgx.NamedArgs(a).RewriteQuery(context.Background(), nil, sql, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got != want || !slices.Equal(args, wantArgs) {
		t.Fatalf("rewrite of %q with %v:\n got %q %v\nwant %q %v (pgx.NamedArgs)", sql, a, got, args, want, wantArgs)
	}
	return got, args
}

// The remembered rewrite gives what pgx.NamedArgs gives, for the first
// execution and the next ones, with other values, a name used twice, an
// @ inside a string literal, and a name the arguments lack.
func TestRewriteIsPgxs(t *testing.T) {
	const q = `SELECT @b::int, '@a', @a::text, @b::int + 1, @c::text -- @d`
	rewrite(t, q, pgnamed.Args{"a": "x", "b": 1, "c": "y"})
	sql, args := rewrite(t, q, pgnamed.Args{"a": "z", "b": 2, "c": "w", "unused": 3})
	if !strings.Contains(sql, "$3") || len(args) != 3 {
		t.Fatalf("%q %v: want three parameters", sql, args)
	}
	// c missing: NULL, as with pgx.NamedArgs, and not remembered.
	const q2 = `SELECT @a::text, @c::text`
	rewrite(t, q2, pgnamed.Args{"a": "x"})
	rewrite(t, q2, pgnamed.Args{"a": "x", "c": "y"})
	rewrite(t, q2, pgnamed.Args{"a": "x"})
}

func BenchmarkRewrite(b *testing.B) {
	q := strings.Repeat("SELECT @customer::text, @meter::text, @now::timestamptz FROM t WHERE x = 'a@b' AND y = @cost::numeric;\n", 40)
	a := map[string]any{"customer": "acme", "meter": "tokens", "now": 1, "cost": "1"}
	ctx := context.Background()
	b.Run("pgx.NamedArgs", func(b *testing.B) {
		for b.Loop() {
			_, _, _ = pgx.NamedArgs(a).RewriteQuery(ctx, nil, q, nil)
		}
	})
	b.Run("pgnamed.Args", func(b *testing.B) {
		for b.Loop() {
			_, _, _ = pgnamed.Args(a).RewriteQuery(ctx, nil, q, nil)
		}
	})
}
