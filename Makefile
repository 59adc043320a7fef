# The test command of README.md. Tests need the local Postgres (see .ci/run).
.PHONY: test build bench fuzz

test:
	go vet ./...
	go tool staticcheck ./...
	go test -race -count=1 -timeout 20m ./...

build:
	go build -o bin/tally ./cmd/tally

bench:
	go test -run '^$$' -bench . -benchtime 3x ./ledger/
