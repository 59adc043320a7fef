// Command tally is the metering ledger's single binary. See `tally --help`.
package main

import (
	"os"

	"github.com/tally-ledger/tally/cmd/tally/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:])) }
