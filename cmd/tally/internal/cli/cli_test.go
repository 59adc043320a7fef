package cli

import (
	"bytes"
	"os"
	"testing"

	"github.com/tally-ledger/tally/cmd/tally/internal/bench/floodbench"
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

// TestMain lets the test binary stand in for tally where a command runs
// tally as a child process (bench flood's load generator).
func TestMain(m *testing.M) {
	if os.Getenv(floodbench.LoadEnv) == "1" {
		os.Exit(Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}
