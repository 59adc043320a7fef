package admit

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// spendReport is a grant's final spent, kept in Dir until Tally has it:
// a release that cannot be delivered now is delivered when Tally answers
// again, by this run or the next one on the same directory. Delivered
// before the grant is reclaimed, it frees the unspent part; after, Tally
// records it as a late report that corrects the record and frees nothing.
type spendReport struct {
	Grant      string    `json:"grant"`
	Holder     string    `json:"holder"`
	Generation int64     `json:"generation"`
	Customer   string    `json:"customer"`
	Meter      string    `json:"meter"`
	Spent      int64     `json:"spent"`
	ValidUntil time.Time `json:"valid_until"`
	// full: the grant was spent in full. Tally records such a grant the
	// same whether this report reaches it or the grant is reclaimed after
	// a crash (as fully spent), so a crash before the report is taken
	// loses nothing: it need not be on disk before it is sent.
	full bool
}

const (
	spendPrefix   = "spend-"
	spendPending  = ".json"
	spendRejected = ".rejected"
)

func (c *Client) spendPath(grant string) string {
	return filepath.Join(c.cfg.Dir, spendPrefix+grant+spendPending)
}

// keptReports is a file of final spend reports: those of one call, kept
// together (a JSON array, written and fsynced once: a tick's releases
// cost one fsync, not one per grant), named after the first one's grant.
// The file is sealed: keptSealed, the CRC-32C of the JSON (4 bytes, big
// endian), the JSON. A bit flip that left the JSON valid (a digit of
// spent) would otherwise be delivered, and Tally would free capacity the
// gateway had admitted. A file that fails its CRC is set aside like one
// that does not decode: its grants are reclaimed as fully spent, which
// frees nothing admitted. A file of plain JSON (an array, or a single
// object) was kept by an earlier version of this package and is read as
// it is.
type keptReports struct {
	path    string
	reports []spendReport
}

// keptSealed is the first byte of a sealed file; plain JSON starts with
// '[' or '{', several bits away.
const keptSealed = 0x01

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func (f *keptReports) write() error {
	js, err := json.Marshal(f.reports)
	if err != nil {
		return err
	}
	b := make([]byte, 5, 5+len(js))
	b[0] = keptSealed
	binary.BigEndian.PutUint32(b[1:], crc32.Checksum(js, castagnoli))
	return writeFileSync(f.path, append(b, js...))
}

func readKept(path string) (*keptReports, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) > 0 && b[0] == keptSealed {
		if len(b) < 5 {
			return nil, fmt.Errorf("%d bytes, too short for a sealed file", len(b))
		}
		js := b[5:]
		if sum, stored := crc32.Checksum(js, castagnoli), binary.BigEndian.Uint32(b[1:5]); sum != stored {
			return nil, fmt.Errorf("the file fails its CRC-32C (%08x, stored %08x)", sum, stored)
		}
		b = js
	}
	var rs []spendReport
	if t := bytes.TrimLeft(b, " \t\r\n"); len(t) > 0 && t[0] == '{' {
		rs = make([]spendReport, 1)
		err = json.Unmarshal(b, &rs[0])
	} else {
		err = json.Unmarshal(b, &rs)
	}
	if err != nil {
		return nil, err
	}
	if len(rs) == 0 {
		return nil, fmt.Errorf("no spend report in %q", b)
	}
	for _, r := range rs {
		if r.Grant == "" || r.Holder == "" || r.Generation <= 0 || r.Spent < 0 {
			return nil, fmt.Errorf("not a spend report: %+v", r)
		}
	}
	return &keptReports{path: path, reports: rs}, nil
}

// outcome is what became of a final spend report sent to Tally.
type outcome int8

const (
	kept     outcome = iota // not taken now (unreachable, load, time, stale generation): sent again later
	settled                 // Tally has it: delivered now, or earlier
	rejected                // never deliverable: set aside for an operator
)

// finalReports keeps rs on disk (fsynced), then delivers them together
// (deliverAll) unless Tally is known to be unreachable or asked for a
// pause: then the loop delivers them once Tally answers. Reports of
// grants spent in full, which a crash cannot lose (spendReport.full), are
// not written first: they go in the same call, and only those Tally does
// not take are kept then. A tight budget gives back a spent grant per
// request or so, and each file cost two fsyncs beside Tally's own.
func (c *Client) finalReports(ctx context.Context, rs []spendReport) {
	for len(rs) > 0 {
		n := min(len(rs), maxReleases)
		batch := rs[:n:n]
		rs = rs[n:]
		send := !c.paused(time.Now()) && ctx.Err() == nil
		var partial, full []int // indexes into batch
		for i, r := range batch {
			if r.full && send {
				full = append(full, i)
			} else {
				partial = append(partial, i)
			}
		}
		var f *keptReports // the partly spent reports, on disk before they go
		if len(partial) > 0 {
			f = &keptReports{path: c.spendPath(batch[partial[0]].Grant), reports: pick(batch, partial)}
			c.keep(f)
		}
		if !send {
			continue
		}
		outs := c.deliverAll(ctx, batch)
		if f != nil {
			c.settleFile(f, pick(outs, partial))
		}
		var left []int // spent in full, not taken: kept now, sent again
		for _, i := range full {
			if outs[i] != settled {
				left = append(left, i)
			}
		}
		if len(left) > 0 {
			g := &keptReports{path: c.spendPath(batch[left[0]].Grant), reports: pick(batch, left)}
			c.keep(g)
			c.settleFile(g, pick(outs, left)) // sets aside those Tally rejected
		}
	}
}

// pick is xs at the indexes at, in that order.
func pick[T any](xs []T, at []int) []T {
	out := make([]T, len(at))
	for j, i := range at {
		out[j] = xs[i]
	}
	return out
}

// keep writes f to disk, fsynced, for the loop to send until Tally has it.
func (c *Client) keep(f *keptReports) {
	if err := f.write(); err != nil {
		// Still sent; only a crash before Tally has them loses them.
		c.log.Error("final spend reports not kept on disk", "reports", len(f.reports), "file", f.path, "err", err)
	}
	c.spendOnDisk.Store(true) // after the write: a scan that clears it sees the file
}

// deliverReports sends every kept final spend report (this run's and
// earlier runs'), stopping at the first call that Tally does not take for
// reachability or load (force: not before the first, even while paused
// for an unreachable Tally). It returns how many remain and their units.
func (c *Client) deliverReports(ctx context.Context, force bool) (left int, spent int64) {
	if !c.spendOnDisk.Swap(false) && !force {
		return 0, 0 // nothing written since the last scan found none
	}
	defer func() {
		if left > 0 {
			c.spendOnDisk.Store(true)
		}
	}()
	paths, _ := filepath.Glob(filepath.Join(c.cfg.Dir, spendPrefix+"*"+spendPending))
	var files []*keptReports
	outs := map[*keptReports][]outcome{}
	for _, p := range paths {
		f, err := readKept(p)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) { // delivered meanwhile by finalReports
				c.log.Error("final spend reports unreadable; set aside", "file", p, "err", err)
				c.setAside(p)
			}
			continue
		}
		files = append(files, f)
		outs[f] = make([]outcome, len(f.reports)) // kept, until sent
	}
	// Sent in calls of up to maxReleases reports of one holder each.
	type at struct {
		f *keptReports
		i int
	}
	var batch []spendReport
	var where []at
	send := func() {
		if len(batch) == 0 {
			return
		}
		if force {
			force = false
			c.reach.pausedUntil.Store(0)
		}
		if !c.paused(time.Now()) && ctx.Err() == nil {
			for j, o := range c.deliverAll(ctx, batch) {
				outs[where[j].f][where[j].i] = o
			}
		}
		batch, where = batch[:0], where[:0]
	}
	for _, f := range files {
		for i, r := range f.reports {
			if c.waiting(r.Grant) {
				continue
			}
			if len(batch) > 0 && (batch[0].Holder != r.Holder || len(batch) == maxReleases) {
				send()
			}
			batch, where = append(batch, r), append(where, at{f, i})
		}
	}
	send()
	for _, f := range files {
		for i, r := range f.reports {
			if outs[f][i] == kept {
				left++
				spent += r.Spent
			}
		}
		c.settleFile(f, outs[f])
	}
	c.metrics.undelivered.Set(float64(left))
	return left, spent
}

// settleFile keeps on disk what is left of f after its reports' outcomes:
// rejected ones are set aside, one file each; the file goes once none is
// kept, and is rewritten with those kept when some were settled.
func (c *Client) settleFile(f *keptReports, out []outcome) {
	c.keptMu.Lock()
	defer c.keptMu.Unlock()
	var left []spendReport
	for i, r := range f.reports {
		switch out[i] {
		case kept:
			left = append(left, r)
		case rejected:
			b, _ := json.Marshal(r)
			p := strings.TrimSuffix(c.spendPath(r.Grant), spendPending) + spendRejected
			if err := writeFileSync(p, b); err != nil {
				c.log.Error("final spend report", "file", p, "err", err)
			}
		}
	}
	switch {
	case len(left) == len(f.reports):
	case len(left) == 0:
		if err := os.Remove(f.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			c.log.Error("final spend reports", "file", f.path, "err", err)
		}
	default:
		f.reports = left
		if err := f.write(); err != nil {
			c.log.Error("final spend reports", "file", f.path, "err", err)
		}
	}
}

// maxReleases is the most final reports sent in one call (Tally's bound on
// POST /v1/grants/release).
const maxReleases = 256

// deliver sends r as its grant's release.
func (c *Client) deliver(ctx context.Context, r spendReport) outcome {
	var ans grantAnswer
	err := c.call(ctx, "release", "/v1/grants/"+r.Grant+"/release", map[string]any{
		"holder": r.Holder, "generation": r.Generation, "spent": strconv.FormatInt(r.Spent, 10),
	}, &ans)
	return c.settle(r, ans, err)
}

// releasesAnswer is POST /v1/grants/release's answer: every release's
// outcome, in order.
type releasesAnswer struct {
	Items []struct {
		Status  int          `json:"status"`
		Grant   *grantAnswer `json:"grant"`
		Problem *problem     `json:"problem"`
	} `json:"items"`
}

// deliverAll sends the reports of one holder as one call to
// POST /v1/grants/release (one at a time when there is only one, or when
// this Tally has no such route), and settles each by its own outcome.
func (c *Client) deliverAll(ctx context.Context, rs []spendReport) []outcome {
	if len(rs) == 1 || c.noBatchRelease.Load() {
		return c.deliverEach(ctx, rs)
	}
	items := make([]map[string]any, len(rs))
	for i, r := range rs {
		items[i] = map[string]any{"grant": r.Grant, "generation": r.Generation, "spent": strconv.FormatInt(r.Spent, 10)}
	}
	var ans releasesAnswer
	err := c.call(ctx, "release", "/v1/grants/release", map[string]any{"holder": rs[0].Holder, "releases": items}, &ans)
	var te *TallyError
	if errors.As(err, &te) && (te.Status == http.StatusNotFound || te.Status == http.StatusMethodNotAllowed) {
		// A Tally from before the route: one release per call from now on.
		c.noBatchRelease.Store(true)
		return c.deliverAll(ctx, rs)
	}
	if errors.As(err, &te) {
		// The call as a whole refused (one report Tally cannot read makes
		// the body invalid): one per call, so only that one is set aside.
		return c.deliverEach(ctx, rs)
	}
	if err == nil && len(ans.Items) != len(rs) {
		err = &unreachableError{fmt.Errorf("release of %d grants answered with %d outcomes", len(rs), len(ans.Items))}
	}
	out := make([]outcome, len(rs))
	for i, r := range rs {
		if err != nil {
			out[i] = c.settle(r, grantAnswer{}, err)
			continue
		}
		it := ans.Items[i]
		var g grantAnswer
		var itErr error
		switch {
		case it.Status == http.StatusOK && it.Grant != nil:
			g = *it.Grant
		case it.Problem != nil:
			ite := &TallyError{Path: "/v1/grants/" + r.Grant + "/release", Status: it.Status, Type: it.Problem.Type, Detail: it.Problem.Detail}
			if it.Problem.NextGeneration != nil {
				ite.next = *it.Problem.NextGeneration
			}
			itErr = ite
		default:
			itErr = &TallyError{Path: "/v1/grants/" + r.Grant + "/release", Status: it.Status}
		}
		out[i] = c.settle(r, g, itErr)
	}
	return out
}

// deliverEach sends rs one per call, stopping at the first that Tally does
// not take for reachability or load (the rest wait too).
func (c *Client) deliverEach(ctx context.Context, rs []spendReport) []outcome {
	out := make([]outcome, len(rs))
	for i, r := range rs {
		if out[i] = c.deliver(ctx, r); out[i] == kept && (c.paused(time.Now()) || ctx.Err() != nil || c.waiting(r.Grant)) {
			break
		}
	}
	return out
}

// settle reads a release's answer (ans, err) for r.
func (c *Client) settle(r spendReport, ans grantAnswer, err error) outcome {
	var te *TallyError
	switch {
	case err == nil:
		if ans.LateReport {
			// Reclaimed before the report arrived: recorded, nothing freed.
			c.log.Info("late final spend report recorded", "grant", r.Grant, "spent", r.Spent)
			c.metrics.reports.WithLabelValues("late").Inc()
		} else {
			c.metrics.reports.WithLabelValues("delivered").Inc()
		}
		return settled
	case errors.As(err, &te) && te.Type == problemGrantEnded:
		// Released already: an earlier delivery whose answer was lost.
		c.metrics.reports.WithLabelValues("delivered").Inc()
		return settled
	case errors.As(err, &te) && te.Type == problemStaleGen:
		// Sent by a newer run for a grant still live: Tally takes it as a
		// late report once the grant is reclaimed. Asked again in a second.
		c.wait(r.Grant, time.Second)
		return kept
	case errors.As(err, &te) && refusedCredentials(te):
		// The token revoked or not this holder's: a new token delivers it
		// (a report set aside would strand its grant's unspent capacity).
		// Kept, and loud; asked again in a while, not at every tick.
		c.log.Error("final spend report refused for the gateway's token; kept in Dir until a valid token delivers it",
			"grant", r.Grant, "spent", r.Spent, "err", err)
		c.wait(r.Grant, credentialRetry)
		return kept
	case errors.As(err, &te):
		// Never deliverable (another holder's grant, an unknown grant, a
		// spent Tally refuses): kept aside for an operator, and loud.
		c.log.Error("final spend report refused by Tally; set aside", "grant", r.Grant, "spent", r.Spent, "err", err)
		c.metrics.reports.WithLabelValues("rejected").Inc()
		return rejected
	default:
		return kept // unreachable, refused for load, or out of time
	}
}

// credentialRetry is how long a report refused for the token waits before
// it is sent again.
const credentialRetry = 30 * time.Second

// refusedCredentials: Tally refused the call for the token that made it
// (401: unknown, revoked; 403: not a gateway token, or another holder's),
// not for what it asked.
func refusedCredentials(te *TallyError) bool {
	return te.Status == http.StatusUnauthorized || te.Status == http.StatusForbidden
}

// setAside renames a kept file Tally can never take (unreadable) for an
// operator.
func (c *Client) setAside(path string) {
	if err := os.Rename(path, strings.TrimSuffix(path, spendPending)+spendRejected); err != nil {
		c.log.Error("final spend report", "file", path, "err", err)
	}
}

// UndeliveredError: Close could not deliver every final spend report
// (Tally hung, down or refusing for load within Close's bound). The
// reports are kept in Config.Dir and delivered by the next Client on that
// directory; nothing is lost.
type UndeliveredError struct {
	// Reports is how many final spend reports are kept undelivered, and
	// Spent the units they report.
	Reports int
	Spent   int64
	Dir     string
}

func (e *UndeliveredError) Error() string {
	return fmt.Sprintf("admit: %d final spend reports (%d units spent) not delivered to Tally; kept in %s for the next run to deliver",
		e.Reports, e.Spent, e.Dir)
}

// waiting says a report is not to be sent again yet; wait sets when. A
// time passed is forgotten when read: the report is being sent again, and
// reportAt holds only the reports still waiting.
func (c *Client) waiting(grant string) bool {
	c.reportMu.Lock()
	defer c.reportMu.Unlock()
	at, ok := c.reportAt[grant]
	if ok && !time.Now().Before(at) {
		delete(c.reportAt, grant)
		return false
	}
	return ok
}

func (c *Client) wait(grant string, d time.Duration) {
	c.reportMu.Lock()
	defer c.reportMu.Unlock()
	c.reportAt[grant] = time.Now().Add(d)
}
