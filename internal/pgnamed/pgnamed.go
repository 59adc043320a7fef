// Package pgnamed is pgx's named arguments with the statement's rewrite
// into positional parameters remembered. pgx.NamedArgs lexes the whole
// statement at every execution to find its @names: for the admission
// store's largest statements (several kilobytes) that was a third of a
// debit's CPU in the API (docs/performance.md, "Where the exact path's
// CPU goes"). Args lexes a statement once and afterwards only puts its
// values in order.
//
// Use it where the statement text is a constant of the program: the
// rewrites are kept for the life of the process, one per text.
package pgnamed

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"
)

// Args are a statement's named arguments (@name), as pgx.NamedArgs: a
// name the statement uses that Args lacks is NULL.
type Args map[string]any

// rewritten is a statement in positional form and the name of each
// parameter, $1 first.
type rewritten struct {
	sql   string
	names []string
}

var rewrites sync.Map // statement text → *rewritten

// RewriteQuery implements pgx.QueryRewriter.
func (a Args) RewriteQuery(ctx context.Context, conn *pgx.Conn, sql string, args []any) (string, []any, error) {
	if r, ok := rewrites.Load(sql); ok {
		r := r.(*rewritten)
		out := make([]any, len(r.names))
		for i, n := range r.names {
			out[i] = a[n]
		}
		return r.sql, out, nil
	}
	// pgx's own rewrite, with each argument standing for its name: the
	// arguments it returns name the parameters in order.
	names := make(pgx.NamedArgs, len(a))
	for k := range a {
		names[k] = k
	}
	pos, ordered, err := names.RewriteQuery(ctx, conn, sql, args)
	if err != nil {
		return "", nil, err
	}
	r := &rewritten{sql: pos, names: make([]string, len(ordered))}
	for i, n := range ordered {
		s, ok := n.(string)
		if !ok {
			// A name these arguments lack: not remembered (another
			// execution may name it), rewritten by pgx this time.
			return pgx.NamedArgs(a).RewriteQuery(ctx, conn, sql, args)
		}
		r.names[i] = s
	}
	rewrites.Store(sql, r)
	return a.RewriteQuery(ctx, conn, sql, args)
}
