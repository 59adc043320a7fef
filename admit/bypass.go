package admit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// journal keeps bypasses on disk: one line per admission made without a
// grant, synced before Admit returns. Reporting renames the file to a
// pending report first, so a report is sent under one id until Tally has
// it, across restarts.
//
// The file starts with journalSealed, and each line is sealed: customer,
// meter, cost, time (Unix nanoseconds) and the CRC-32C of those four
// fields as written (8 hex digits), separated by tabs. A bit flip that
// left a line parseable (a digit of a cost, of a customer id, of a time)
// would otherwise be reported as admissions that did not happen, or hide
// ones that did: a report with a line that fails its CRC is set aside
// whole (reportBypasses). Lines of four fields, without a CRC, were
// written by an earlier version of this package and are read as they are
// in a file without journalSealed.
type journal struct {
	mu   sync.Mutex
	dir  string
	gen  int64
	seq  int
	f    *os.File
	size int64
}

func openJournal(dir string, gen int64) (*journal, error) {
	// Logs of earlier generations become pending reports, under a report
	// id of their own when a run that reused their generation (its
	// generation file moved aside) left a report under theirs.
	old, _ := filepath.Glob(filepath.Join(dir, "bypass-*.log"))
	for _, p := range old {
		to := strings.TrimSuffix(p, ".log") + ".pending"
		var g int64
		var n int
		if _, err := fmt.Sscanf(filepath.Base(p), "bypass-%d-%d.log", &g, &n); err == nil && reportTaken(to) {
			lj := &journal{dir: dir, gen: g, seq: n}
			lj.skipTaken()
			to = strings.TrimSuffix(lj.path(), ".log") + ".pending"
		}
		if err := os.Rename(p, to); err != nil {
			return nil, fmt.Errorf("admit: bypass journal: %w", err)
		}
	}
	j := &journal{dir: dir, gen: gen}
	if err := j.open(); err != nil {
		return nil, err
	}
	return j, nil
}

func (j *journal) path() string {
	return filepath.Join(j.dir, fmt.Sprintf("bypass-%d-%d.log", j.gen, j.seq))
}

// reportTaken says a report id, given as its pending report's path, is
// in use in Dir: pending, or set aside as damaged.
func reportTaken(pending string) bool {
	for _, p := range []string{pending, strings.TrimSuffix(pending, ".pending") + ".damaged"} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			return true
		}
	}
	return false
}

// skipTaken moves seq past the report ids of its generation in use in
// Dir: a generation taken again (its generation file moved aside, or a
// next_generation an earlier run on this Dir used without reaching Tally)
// would otherwise seal its log over a report not yet delivered.
func (j *journal) skipTaken() {
	for reportTaken(strings.TrimSuffix(j.path(), ".log") + ".pending") {
		j.seq++
	}
}

func (j *journal) open() error {
	j.skipTaken()
	f, err := os.OpenFile(j.path(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("admit: bypass journal: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	j.f, j.size = f, st.Size()
	return nil
}

// journalSealed is the first line of a journal whose lines are sealed.
const journalSealed = "#crc32c\n"

// lineSum is the CRC-32C of a journal line's fields, as written.
func lineSum(fields string) string {
	return fmt.Sprintf("%08x", crc32.Checksum([]byte(fields), castagnoli))
}

func (j *journal) append(customer, meter string, cost int64, at time.Time) error {
	fields := customer + "\t" + meter + "\t" + strconv.FormatInt(cost, 10) + "\t" + strconv.FormatInt(at.UnixNano(), 10)
	line := fields + "\t" + lineSum(fields) + "\n"
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return fmt.Errorf("admit: closed")
	}
	if j.size == 0 {
		line = journalSealed + line
	}
	n, err := j.f.WriteString(line)
	j.size += int64(n)
	if err != nil {
		return err
	}
	return j.f.Sync()
}

// seal turns the current log, when not empty, into a pending report.
func (j *journal) seal() (sealed bool, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil || j.size == 0 {
		return false, nil
	}
	if err := j.f.Close(); err != nil {
		return false, err
	}
	p := j.path()
	if err := os.Rename(p, strings.TrimSuffix(p, ".log")+".pending"); err != nil {
		return false, err
	}
	j.seq++
	return true, j.open()
}

// setGeneration moves the current log to gen's report ids: used when the
// holder recovers a newer generation, so its reports do not reuse ids a
// lost run stored. The log was never sent (only pending reports are), so
// renaming it sends each bypass once.
func (j *journal) setGeneration(gen int64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return nil
	}
	old, oldGen, oldSeq := j.path(), j.gen, j.seq
	if err := j.f.Close(); err != nil {
		return err
	}
	j.f = nil
	j.gen, j.seq = gen, 0
	j.skipTaken()
	if j.size == 0 {
		_ = os.Remove(old)
	} else if err := os.Rename(old, j.path()); err != nil {
		j.gen, j.seq = oldGen, oldSeq // keep logging to the old log
		return errors.Join(err, j.open())
	}
	return j.open()
}

// freshID returns a pending report path under a report id this run has
// not used: the current log's, which moves on to the next one.
func (j *journal) freshID() (string, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return "", fmt.Errorf("admit: closed")
	}
	if err := j.f.Close(); err != nil {
		return "", err
	}
	j.f = nil
	p := j.path()
	if j.size > 0 {
		// Sealed as a report of its own; the id after it is free.
		if err := os.Rename(p, strings.TrimSuffix(p, ".log")+".pending"); err != nil {
			return "", errors.Join(err, j.open())
		}
		j.seq++
		j.skipTaken()
		p = j.path()
	} else {
		_ = os.Remove(p)
	}
	j.seq++
	return strings.TrimSuffix(p, ".log") + ".pending", j.open()
}

func (j *journal) close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	if j.size == 0 {
		_ = os.Remove(j.path())
	}
	return err
}

type bypassItem struct {
	Customer   string    `json:"customer"`
	Meter      string    `json:"meter"`
	Amount     string    `json:"amount"`
	Admissions int64     `json:"admissions"`
	FirstAt    time.Time `json:"first_at"`
	LastAt     time.Time `json:"last_at"`
}

// readReport aggregates a pending file per customer and meter. damaged
// counts its lines that fail their CRC or do not parse: such a report is
// not sent.
func readReport(path string) (items []bypassItem, damaged int, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	type agg struct {
		amount, n     int64
		first, last   int64
		customer, mtr string
	}
	byKey := map[string]*agg{}
	r := bufio.NewReader(f)
	for first, sealed := true, false; ; first = false {
		line, err := r.ReadString('\n')
		if errors.Is(err, io.EOF) {
			break // "" at the end, or a torn last line of a crash: its Admit never returned
		}
		if err != nil {
			return nil, 0, err
		}
		line = strings.TrimSuffix(line, "\n")
		if first && line+"\n" == journalSealed {
			sealed = true
			continue
		}
		parts := strings.Split(line, "\t")
		switch {
		case len(parts) == 5 && lineSum(strings.Join(parts[:4], "\t")) == parts[4]:
		case len(parts) == 4 && !sealed: // an earlier version's line
		default:
			damaged++
			continue
		}
		cost, err1 := strconv.ParseInt(parts[2], 10, 64)
		at, err2 := strconv.ParseInt(parts[3], 10, 64)
		if err1 != nil || err2 != nil || cost < 0 {
			damaged++
			continue
		}
		k := parts[0] + "\t" + parts[1]
		a := byKey[k]
		if a == nil {
			a = &agg{first: at, last: at, customer: parts[0], mtr: parts[1]}
			byKey[k] = a
		}
		a.amount += cost
		a.n++
		a.first, a.last = min(a.first, at), max(a.last, at)
	}
	var out []bypassItem
	for _, a := range byKey {
		out = append(out, bypassItem{Customer: a.customer, Meter: a.mtr, Amount: strconv.FormatInt(a.amount, 10),
			Admissions: a.n, FirstAt: time.Unix(0, a.first).UTC(), LastAt: time.Unix(0, a.last).UTC()})
	}
	sort.Slice(out, func(i, k int) bool { return out[i].Customer+out[i].Meter < out[k].Customer+out[k].Meter })
	return out, damaged, nil
}

// reportBypasses sends every pending report; each file is removed once
// Tally has stored it (resending the same report id is harmless).
func (c *Client) reportBypasses(ctx context.Context) {
	sealed, err := c.journal.seal()
	if sealed {
		c.bypassesOnDisk.Store(true)
	}
	if err != nil {
		c.log.Error("bypass journal", "err", err)
		return
	}
	if !c.bypassesOnDisk.Swap(false) {
		return // none sealed or left since the last scan found none
	}
	pending, _ := filepath.Glob(filepath.Join(c.cfg.Dir, "bypass-*.pending"))
	for _, p := range pending {
		items, damaged, err := readReport(p)
		if err != nil {
			c.log.Error("bypass report", "file", p, "err", err)
			c.bypassesOnDisk.Store(true) // still there: logged again next round, as before
			continue
		}
		if damaged > 0 {
			c.setAsideBypasses(p, damaged)
			continue
		}
		if len(items) > 0 {
			id := strings.TrimSuffix(filepath.Base(p), ".pending")
			err = c.call(ctx, "bypasses", "/v1/bypasses", map[string]any{"holder": c.cfg.Holder, "generation": c.generation.Load(),
				"report_id": id, "items": items}, nil)
			var te *TallyError
			if errors.As(err, &te) && te.Type == problemBypassConflict {
				// The holder used this id for other bypasses: a run that
				// lost its Dir reuses ids. Not stored: sent again under a
				// new id.
				c.resendBypasses(p, id)
				c.bypassesOnDisk.Store(true)
				continue
			}
			if err != nil {
				c.bypassesOnDisk.Store(true)
				return // try again on the next round
			}
		}
		if err := os.Remove(p); err != nil {
			c.log.Error("bypass report", "file", p, "err", err)
			c.bypassesOnDisk.Store(true)
		}
	}
}

// setAsideBypasses renames the pending report p, with damaged lines that
// fail their CRC or do not parse, to .damaged for an operator. It cannot
// be trusted either way: its wrong lines may report admissions that did
// not happen, or hide some that did.
func (c *Client) setAsideBypasses(p string, damaged int) {
	aside := strings.TrimSuffix(p, ".pending") + ".damaged"
	if err := os.Rename(p, aside); err != nil {
		c.log.Error("bypass report", "file", p, "err", err)
		c.bypassesOnDisk.Store(true)
		return
	}
	c.metrics.bypassDamaged.Inc()
	c.log.Error("bypass report damaged (a line fails its CRC-32C or does not parse); set aside for an operator, not reported",
		"holder", c.cfg.Holder, "file", aside, "damaged_lines", damaged)
}

// resendBypasses moves the pending report p, refused as a conflict under
// id, to a report id not used yet, sent at the next round.
func (c *Client) resendBypasses(p, id string) {
	fresh, err := c.journal.freshID()
	if err == nil {
		err = os.Rename(p, fresh)
	}
	if err != nil {
		c.log.Error("bypass report refused as a conflict, not moved to a new report id", "report_id", id, "err", err)
		return
	}
	c.log.Warn("bypass report id already used by this holder for other bypasses (a run that lost its Dir); sent again under a new id",
		"holder", c.cfg.Holder, "report_id", id, "new_report_id", strings.TrimSuffix(filepath.Base(fresh), ".pending"))
}

// pendingBypassReports counts sealed bypass reports not yet delivered.
func (c *Client) pendingBypassReports() int {
	pending, _ := filepath.Glob(filepath.Join(c.cfg.Dir, "bypass-*.pending"))
	return len(pending)
}
