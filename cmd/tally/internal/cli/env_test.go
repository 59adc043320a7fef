package cli

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/tally-ledger/tally/internal/pgtest"
)

// An environment variable that does not parse is an error naming it (exit
// 2), never silently the default: TALLY_GRACE=2d once meant a grace of 24h.
func TestAnInvalidEnvironmentValueIsAnError(t *testing.T) {
	for _, tc := range []struct{ env, value string }{
		{"TALLY_GRACE", "2d"},
		{"TALLY_GRACE", ""},
	} {
		t.Setenv(tc.env, tc.value)
		_, err := runTally(t, "serve", "--api")
		var ee *ExitError
		if err == nil || !errors.As(err, &ee) || ee.Code != 2 || !strings.Contains(err.Error(), tc.env) {
			t.Errorf("%s=%q: got %v; want an error naming %s with exit code 2", tc.env, tc.value, err, tc.env)
		}
		if code := Main([]string{"periods", "list"}); code != 2 {
			t.Errorf("%s=%q: tally periods list exits %d, want 2", tc.env, tc.value, code)
		}
	}
}

// An invalid flag value exits 2 too, naming the flag.
func TestAnInvalidFlagValueExitsTwo(t *testing.T) {
	_, err := runTally(t, "serve", "--api", "--grace", "2d")
	var ee *ExitError
	if err == nil || !errors.As(err, &ee) || ee.Code != 2 || !strings.Contains(err.Error(), "--grace") {
		t.Errorf("got %v; want an error naming --grace with exit code 2", err)
	}
}

// --help never prints a password given in TALLY_DATABASE_URL.
func TestHelpMasksTheDatabasePassword(t *testing.T) {
	t.Setenv("TALLY_DATABASE_URL", "postgres://billing:s3cr3t-pw@db.internal:5432/tally?sslmode=require")
	for _, cmd := range [][]string{{"serve", "--help"}, {"migrate", "--help"}, {"reconcile", "--help"}, {"produce", "--help"}} {
		out, err := runTally(t, cmd...)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "s3cr3t-pw") || !strings.Contains(out, "billing:") {
			t.Errorf("tally %s prints the password or no user:\n%s", strings.Join(cmd, " "), out)
		}
	}
	t.Setenv("TALLY_DATABASE_URL", "host=db.internal user=billing password=s3cr3t-pw dbname=tally")
	out, err := runTally(t, "serve", "--help")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "s3cr3t-pw") {
		t.Errorf("tally serve --help prints a keyword/value password:\n%s", out)
	}
}

// --grant-max-skew (TALLY_GRANT_MAX_SKEW) outside its bounds is refused
// before anything runs, naming both, with exit code 2.
func TestGrantMaxSkewOutOfBoundsIsRefused(t *testing.T) {
	for _, tc := range []struct {
		env  string
		args []string
	}{
		{"500ms", []string{"serve", "--api"}},
		{"", []string{"serve", "--api", "--grant-max-skew", "11m"}},
		{"0s", []string{"dev"}},
	} {
		if tc.env != "" {
			t.Setenv("TALLY_GRANT_MAX_SKEW", tc.env)
		}
		_, err := runTally(t, tc.args...)
		var ee *ExitError
		if err == nil || !errors.As(err, &ee) || ee.Code != 2 || !strings.Contains(err.Error(), "TALLY_GRANT_MAX_SKEW") ||
			!strings.Contains(err.Error(), "between 1s and 10m0s") {
			t.Errorf("%s with TALLY_GRANT_MAX_SKEW=%q: got %v; want exit 2 naming the bounds", strings.Join(tc.args, " "), tc.env, err)
		}
	}
}

// A mistake in pure configuration (an admin token too short, an embedded
// broker's address tally dev cannot listen on) is refused before anything
// starts, with exit code 2 and the one line that says what to change: not
// after Postgres, Kafka, the migrations and the enforcer started, among
// their shutdown lines.
func TestBadConfigIsRefusedBeforeAnythingStarts(t *testing.T) {
	t.Setenv("TALLY_DATABASE_URL", pgtest.NewEmptyURL(t))
	t.Setenv("TALLY_KAFKA_BROKERS", "")
	for _, tc := range []struct {
		token string
		args  []string
		want  string
	}{
		{"too-short", []string{"dev", "--kafka-addr", "127.0.0.1:0", "--listen", "127.0.0.1:0"}, "TALLY_ADMIN_TOKEN"},
		{"", []string{"dev", "--kafka-addr", "10.1.2.3:9092", "--listen", "127.0.0.1:0"}, "--kafka-addr"},
		{"too-short", []string{"serve", "--api", "--listen", "127.0.0.1:0"}, "TALLY_ADMIN_TOKEN"},
	} {
		t.Setenv("TALLY_ADMIN_TOKEN", tc.token)
		dir := filepath.Join(t.TempDir(), "dev")
		args := tc.args
		if args[0] == "dev" {
			args = append(args, "--dir", dir)
		}
		_, err := runTally(t, args...)
		var ee *ExitError
		if err == nil || !errors.As(err, &ee) || ee.Code != exitUsage || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s with TALLY_ADMIN_TOKEN=%q: %v; want exit 2 naming %s", strings.Join(tc.args, " "), tc.token, err, tc.want)
		}
		if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s with TALLY_ADMIN_TOKEN=%q started something: %s exists (%v)", strings.Join(tc.args, " "), tc.token, dir, err)
		}
	}
}

// Every configuration flag of the commands that run Tally (serve, dev,
// migrate) and of those that reach its database has an environment
// variable, shown in its help. Left out are a run's arguments: which roles
// serve runs, dev's one-off --reset, and the flags kept for compatibility.
func TestEveryConfigurationFlagHasAnEnvironmentVariable(t *testing.T) {
	arguments := map[string]bool{"serve --ingest": true, "serve --api": true, "serve --enforce": true,
		"serve --rebalance-timeout": true, "serve --join-group-backoff": true, "dev --reset": true}
	root := newRoot()
	for _, name := range []string{"serve", "dev", "migrate"} {
		cmd, _, err := root.Find([]string{name})
		if err != nil {
			t.Fatal(err)
		}
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Name == "help" || arguments[name+" --"+f.Name] {
				return
			}
			if !strings.Contains(f.Usage, "[$TALLY_") {
				t.Errorf("tally %s --%s has no environment variable", name, f.Name)
			}
		})
	}
}

// A variable set but empty, for a setting that cannot be empty (a topic,
// a group, an address, a directory, the database URL), is an error naming
// it, as a value that does not parse is: it silently meant the built-in
// default (TALLY_TOPIC= read tally.meter-batches). The flag given empty is
// refused too. Where empty means something (TALLY_KAFKA_BROKERS: no
// broker, for a command that needs none; TALLY_ADMIN_TOKEN for dev: one is
// generated), it keeps working.
func TestAnEmptyEnvironmentValueIsAnError(t *testing.T) {
	db := pgtest.NewURL(t)
	t.Setenv("TALLY_DATABASE_URL", db)
	t.Setenv("TALLY_ADMIN_TOKEN", testAdminToken)
	// Where an empty value is not refused, it must not reach anything:
	// an empty database URL is libpq's defaults (it migrated the
	// database named after the user), an empty directory the current one.
	t.Setenv("PGHOST", "127.0.0.1")
	t.Setenv("PGPORT", "1")
	t.Chdir(t.TempDir())
	for _, tc := range []struct {
		env  string
		args []string
	}{
		{"TALLY_TOPIC", []string{"serve", "--api"}},
		{"TALLY_GROUP", []string{"serve", "--api"}},
		{"TALLY_DECISIONS_TOPIC", []string{"serve", "--api"}},
		{"TALLY_ALERTS_TOPIC", []string{"serve", "--api"}},
		{"TALLY_LISTEN", []string{"serve", "--api"}},
		{"TALLY_DATABASE_URL", []string{"migrate"}},
		{"TALLY_DATABASE_URL", []string{"tokens", "list"}},
		{"TALLY_TOPIC", []string{"reconcile", "--period", "current"}},
		{"TALLY_TOPIC", []string{"produce", "--kafka-brokers", "127.0.0.1:1", "--duration", "1s"}},
		{"TALLY_DEV_DIR", []string{"dev"}},
		{"TALLY_DEV_KAFKA_ADDR", []string{"dev"}},
	} {
		t.Run(tc.env+" "+strings.Join(tc.args, " "), func(t *testing.T) {
			t.Setenv(tc.env, "")
			var out, errOut bytes.Buffer
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			defer cancel()
			args := tc.args
			if tc.args[0] == "serve" && tc.env != "TALLY_LISTEN" {
				args = append(args, "--listen", "127.0.0.1:0")
			}
			code := execute(ctx, args, &out, &errOut)
			if code != exitUsage || !strings.Contains(errOut.String(), `invalid value "" of $`+tc.env) {
				t.Errorf("exit %d, want 2 naming %s; stderr:\n%s", code, tc.env, errOut.String())
			}
		})
	}
	// Given empty on the command line, the flag is refused too.
	for _, tc := range []struct {
		flag string
		args []string
	}{
		{"--topic", []string{"serve", "--api", "--listen", "127.0.0.1:0", "--topic", ""}},
		{"--group", []string{"serve", "--ingest", "--kafka-brokers", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--group", ""}},
		{"--database-url", []string{"reconcile", "--period", "current", "--database-url", ""}},
	} {
		var out, errOut bytes.Buffer
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		code := execute(ctx, tc.args, &out, &errOut)
		cancel()
		if code != exitUsage || !strings.Contains(errOut.String(), `"`+tc.flag+`" flag: must not be empty`) {
			t.Errorf("tally %s: exit %d, want 2 naming %s; stderr:\n%s", strings.Join(tc.args, " "), code, tc.flag, errOut.String())
		}
	}
}
