package cli

import (
	"bytes"
	"testing"
)

// runTally runs the CLI in-process and returns what it printed to stdout.
func runTally(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err := root.ExecuteContext(t.Context())
	return out.String(), err
}
