package devstack

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Defaults for the dev database. On the local server each data directory
// has a database of its own, DefaultDatabase_ and a digest of the
// directory (LocalDatabase); a private cluster (one per data directory)
// names its database DefaultDatabase.
const (
	DefaultDatabase    = "tally"
	DefaultLocalAddr   = "127.0.0.1:5432"
	DefaultPrivatePort = 54329
)

// Postgres is the database `tally dev` uses.
type Postgres struct {
	URL string
	// Source says where it came from: "TALLY_DATABASE_URL", "local server"
	// or "private cluster".
	Source string
	// Dropped names the database Reset dropped before creating it anew
	// ("" when nothing was dropped).
	Dropped string
	// Socket is the private cluster's Unix socket ("" otherwise).
	Socket  string
	stop    func() error
	restart func(ctx context.Context) error
}

// PostgresConfig configures StartPostgres.
type PostgresConfig struct {
	// URL is TALLY_DATABASE_URL: used as is when set and reachable.
	URL string
	// Dir holds the private cluster (Dir/pg) when one is needed.
	Dir string
	// PrivatePort is the private cluster's port. Default 54329.
	PrivatePort int
	// Reset drops tally dev's own database first (the data directory's on
	// the local server, or the private cluster's) and creates it empty.
	// Refused with URL: a database someone chose is never dropped here.
	Reset  bool
	Logger *slog.Logger
}

// StartPostgres finds or starts a database: cfg.URL when set and reachable;
// else the local server at 127.0.0.1:5432 (the data directory's database,
// LocalDatabase(cfg.Dir), created if missing); else a private cluster under Dir/pg started with the installed
// initdb and pg_ctl (as the postgres or nobody user when running as root),
// stopped by Close.
func StartPostgres(ctx context.Context, cfg PostgresConfig) (*Postgres, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.PrivatePort == 0 {
		cfg.PrivatePort = DefaultPrivatePort
	}
	if cfg.Reset && cfg.URL != "" {
		return nil, errors.New("--reset drops only tally dev's own database, and TALLY_DATABASE_URL is set: drop or empty that database yourself, or unset TALLY_DATABASE_URL")
	}
	if cfg.URL != "" {
		if err := ping(ctx, cfg.URL); err == nil {
			return &Postgres{URL: cfg.URL, Source: "TALLY_DATABASE_URL"}, nil
		} else {
			log.Warn("TALLY_DATABASE_URL is not reachable; falling back to a local Postgres", "err", err)
		}
	}
	local := localURL(DefaultLocalAddr, "postgres")
	if err := ping(ctx, local); err == nil {
		name, err := LocalDatabase(cfg.Dir)
		if err != nil {
			return nil, err
		}
		u, dropped, err := ensureDatabase(ctx, local, name, cfg.Reset)
		if err != nil {
			return nil, err
		}
		return &Postgres{URL: u, Source: "local server", Dropped: dropped}, nil
	} else {
		log.Info("no Postgres at "+DefaultLocalAddr+"; starting a private cluster", "reason", err)
	}
	return StartPrivate(ctx, cfg)
}

// LocalDatabase is the name of dir's database on the local server:
// "tally_" and the first 12 hex digits of the SHA-256 of dir's absolute
// path. A database holds the positions of one embedded broker (whose data
// is in dir/kafka), so two clones on one machine, or two data directories,
// never share one: the second's first start would find positions its new
// broker has not reached. The same directory always gets the same
// database.
func LocalDatabase(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("data directory %s: %w", dir, err)
	}
	sum := sha256.Sum256([]byte(filepath.Clean(abs)))
	return DefaultDatabase + "_" + hex.EncodeToString(sum[:6]), nil
}

// Close stops the private cluster, if one was started.
func (p *Postgres) Close() error {
	if p.stop == nil {
		return nil
	}
	return p.stop()
}

// RestartImmediate restarts the private cluster at once (pg_ctl restart -m
// immediate: every session is cut, nothing is flushed, recovery replays the
// WAL) and waits until it accepts connections again; a fault for tests.
func (p *Postgres) RestartImmediate(ctx context.Context) error {
	if p.restart == nil {
		return errors.New("not a private Postgres cluster: it cannot be restarted here")
	}
	return p.restart(ctx)
}

func localURL(addr, db string) string {
	name := "postgres"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	return (&url.URL{Scheme: "postgres", User: url.User(name), Host: addr, Path: "/" + db, RawQuery: "sslmode=disable"}).String()
}

func ping(ctx context.Context, u string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	return c.Close(ctx)
}

// ensureDatabase creates database name on the server of admin (a URL to an
// existing database) if missing and returns a URL to it. With reset it
// drops the database first (its sessions too) and says so in dropped.
func ensureDatabase(ctx context.Context, admin, name string, reset bool) (u, dropped string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", "", err
	}
	defer c.Close(context.WithoutCancel(ctx))
	if reset {
		var existed bool
		if err := c.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&existed); err != nil {
			return "", "", fmt.Errorf("check database %s: %w", name, err)
		}
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			return "", "", fmt.Errorf("--reset: drop database %s: %w", name, err)
		}
		if existed {
			dropped = name
		}
	}
	u, err = createDatabase(ctx, c, admin, name)
	return u, dropped, err
}

func createDatabase(ctx context.Context, c *pgx.Conn, admin, name string) (string, error) {
	var exists bool
	if err := c.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", fmt.Errorf("check database %s: %w", name, err)
	}
	if !exists {
		if _, err := c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			var again bool
			// Another process may have created it meanwhile.
			if qerr := c.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&again); qerr != nil || !again {
				return "", fmt.Errorf("create database %s: %w", name, err)
			}
		}
	}
	u, err := url.Parse(admin)
	if err != nil {
		return "", err
	}
	u.Path = "/" + name
	return u.String(), nil
}

// pgBinDir finds the newest /usr/lib/postgresql/<version>/bin with initdb
// and pg_ctl, or the directory of initdb on PATH.
func pgBinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "pg_ctl")) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		d := filepath.Dir(p)
		if isExec(filepath.Join(d, "pg_ctl")) {
			return d, nil
		}
	}
	return "", errors.New("no initdb/pg_ctl found under /usr/lib/postgresql/*/bin or on PATH; install PostgreSQL or set TALLY_DATABASE_URL")
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// StartPrivate starts (initialising it on first use) a cluster of its own
// under cfg.Dir/pg, reachable only through the Unix socket
// cfg.Dir/pg/run/.s.PGSQL.<PrivatePort> (a directory only its user can
// enter; no TCP); Close stops it. A cluster left running by a tally dev
// that was killed is reused.
func StartPrivate(ctx context.Context, cfg PostgresConfig) (*Postgres, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.PrivatePort == 0 {
		cfg.PrivatePort = DefaultPrivatePort
	}
	bin, err := pgBinDir()
	if err != nil {
		return nil, err
	}
	base, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	data := filepath.Join(base, "pg", "data")
	sock := filepath.Join(base, "pg", "run")
	logFile := filepath.Join(base, "pg", "postgres.log")
	if err := os.MkdirAll(filepath.Join(base, "pg"), 0o755); err != nil {
		return nil, err
	}
	// The cluster trusts whoever connects (it is a dev database with a
	// superuser), so only its own user may connect: it listens on no TCP
	// port, only on a Unix socket in a directory of mode 0700 owned by the
	// user it runs as (root, running tally dev, enters it anyway).
	if err := os.MkdirAll(sock, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(sock, 0o700); err != nil {
		return nil, err
	}

	// Postgres refuses to run as root: run it as "postgres" (or "nobody").
	var runAs string
	if os.Geteuid() == 0 {
		for _, name := range []string{"postgres", "nobody"} {
			if _, err := user.Lookup(name); err == nil {
				runAs = name
				break
			}
		}
		if runAs == "" {
			return nil, errors.New("running as root and no postgres or nobody user to run a private Postgres as; set TALLY_DATABASE_URL")
		}
		// The server runs as runAs: every directory above its data must be
		// searchable by others.
		for d := base; ; d = filepath.Dir(d) {
			if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
				return nil, fmt.Errorf("a private Postgres runs as %q, which cannot enter %s (mode %v); run tally dev from another directory, chmod o+x it, or set TALLY_DATABASE_URL",
					runAs, d, fi.Mode().Perm())
			}
			if d == filepath.Dir(d) {
				break
			}
		}
		u, _ := user.Lookup(runAs)
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for _, p := range []string{filepath.Join(base, "pg"), sock} {
			if err := os.Chown(p, uid, gid); err != nil {
				return nil, fmt.Errorf("chown %s to %s: %w", p, runAs, err)
			}
		}
		if err := chownTree(data, uid, gid); err != nil {
			return nil, err
		}
	}
	run := func(name string, args ...string) error {
		path := filepath.Join(bin, name)
		var cmd *exec.Cmd
		if runAs != "" {
			cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", runAs, "--", path}, args...)...)
		} else {
			cmd = exec.CommandContext(ctx, path, args...)
		}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
		}
		return nil
	}

	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err != nil {
		log.Info("initialising a private Postgres cluster", "dir", data, "user", runAs)
		if err := run("initdb", "-D", data, "-U", "tally", "--auth=trust", "-E", "UTF8", "--no-sync"); err != nil {
			return nil, err
		}
	}
	port := strconv.Itoa(cfg.PrivatePort)
	opts := fmt.Sprintf("-p %s -k %s -c listen_addresses='' -c fsync=off", port, sock)
	admin := (&url.URL{Scheme: "postgres", User: url.User("tally"), Path: "/postgres",
		RawQuery: url.Values{"host": {sock}, "port": {port}, "sslmode": {"disable"}}.Encode()}).String()
	// A tally dev that was killed (SIGKILL, OOM) left its cluster running:
	// reuse it when it serves our socket with no TCP listener; restart it
	// with our options otherwise (a cluster started by an older tally dev
	// listened on 127.0.0.1).
	if run("pg_ctl", "-D", data, "status") == nil {
		if private(ctx, admin) {
			log.Info("reusing the private Postgres cluster left running", "dir", data)
		} else if err := run("pg_ctl", "-D", data, "-l", logFile, "-o", opts, "-m", "fast", "-w", "-t", "60", "restart"); err != nil {
			return nil, fmt.Errorf("restart private Postgres (log: %s): %w", logFile, err)
		}
	} else if err := run("pg_ctl", "-D", data, "-l", logFile, "-o", opts, "-w", "-t", "60", "start"); err != nil {
		return nil, fmt.Errorf("start private Postgres (log: %s): %w", logFile, err)
	}
	stop := func() error {
		// Not bound to ctx: stopping must work after ctx is cancelled.
		path := filepath.Join(bin, "pg_ctl")
		args := []string{"-D", data, "-m", "fast", "-w", "stop"}
		var cmd *exec.Cmd
		if runAs != "" {
			cmd = exec.Command("runuser", append([]string{"-u", runAs, "--", path}, args...)...)
		} else {
			cmd = exec.Command(path, args...)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("stop private Postgres: %w: %s", err, out)
		}
		return nil
	}
	restart := func(ctx context.Context) error {
		path := filepath.Join(bin, "pg_ctl")
		args := []string{"-D", data, "-l", logFile, "-o", opts, "-m", "immediate", "-w", "-t", "60", "restart"}
		var cmd *exec.Cmd
		if runAs != "" {
			cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", runAs, "--", path}, args...)...)
		} else {
			cmd = exec.CommandContext(ctx, path, args...)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("restart private Postgres (log: %s): %w: %s", logFile, err, out)
		}
		return nil
	}
	u, dropped, err := ensureDatabase(ctx, admin, DefaultDatabase, cfg.Reset)
	if err != nil {
		_ = stop()
		return nil, err
	}
	return &Postgres{URL: u, Source: "private cluster (" + data + ")", Dropped: dropped,
		Socket: filepath.Join(sock, ".s.PGSQL."+port), stop: stop, restart: restart}, nil
}

// private reports whether the server at admin (a socket URL) answers and
// listens on no TCP address.
func private(ctx context.Context, admin string) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, admin)
	if err != nil {
		return false
	}
	defer c.Close(context.WithoutCancel(ctx))
	var listen string
	return c.QueryRow(ctx, "SHOW listen_addresses").Scan(&listen) == nil && listen == ""
}

// chownTree chowns p and everything under it, if p exists.
func chownTree(p string, uid, gid int) error {
	if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return filepath.Walk(p, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	})
}
