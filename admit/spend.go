package admit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
}

const (
	spendPrefix   = "spend-"
	spendPending  = ".json"
	spendRejected = ".rejected"
)

func (c *Client) spendPath(grant string) string {
	return filepath.Join(c.cfg.Dir, spendPrefix+grant+spendPending)
}

// finalReports keeps each of rs on disk (fsynced), then delivers them
// together (deliverAll) unless Tally is known to be unreachable or asked
// for a pause: then the loop delivers them once Tally answers.
func (c *Client) finalReports(ctx context.Context, rs []spendReport) {
	if len(rs) == 0 {
		return
	}
	paths := make([]string, len(rs))
	for i, r := range rs {
		paths[i] = c.spendPath(r.Grant)
		b, _ := json.Marshal(r)
		if err := writeFileSync(paths[i], b); err != nil {
			// Still sent below; only a crash before Tally has it loses it.
			c.log.Error("final spend report not kept on disk", "grant", r.Grant, "spent", r.Spent, "err", err)
		}
	}
	for len(rs) > 0 && !c.paused(time.Now()) && ctx.Err() == nil {
		n := min(len(rs), maxReleases)
		c.deliverAll(ctx, paths[:n], rs[:n])
		paths, rs = paths[n:], rs[n:]
	}
}

// deliverReports sends every kept final spend report (this run's and
// earlier runs'), stopping at the first that Tally does not take for
// reachability or load (force: not before the first, even while paused
// for an unreachable Tally). It returns how many remain and their units.
func (c *Client) deliverReports(ctx context.Context, force bool) (left int, spent int64) {
	paths, _ := filepath.Glob(filepath.Join(c.cfg.Dir, spendPrefix+"*"+spendPending))
	// Sent in calls of up to maxReleases reports of one holder each.
	var batch []spendReport
	var batchPaths []string
	send := func() {
		if len(batch) == 0 {
			return
		}
		if force {
			force = false
			c.reach.pausedUntil.Store(0)
		}
		var done []bool
		if !c.paused(time.Now()) && ctx.Err() == nil {
			done = c.deliverAll(ctx, batchPaths, batch)
		}
		for i, r := range batch {
			if done == nil || !done[i] {
				left++
				spent += r.Spent
			}
		}
		batch, batchPaths = batch[:0], batchPaths[:0]
	}
	for _, p := range paths {
		r, err := readSpendReport(p)
		if err != nil {
			c.log.Error("final spend report unreadable; set aside", "file", p, "err", err)
			c.setAside(p)
			continue
		}
		if c.waiting(r.Grant) {
			left++
			spent += r.Spent
			continue
		}
		if len(batch) > 0 && (batch[0].Holder != r.Holder || len(batch) == maxReleases) {
			send()
		}
		batch, batchPaths = append(batch, r), append(batchPaths, p)
	}
	send()
	c.metrics.undelivered.Set(float64(left))
	return left, spent
}

// maxReleases is the most final reports sent in one call (Tally's bound on
// POST /v1/grants/release).
const maxReleases = 256

func readSpendReport(path string) (spendReport, error) {
	var r spendReport
	b, err := os.ReadFile(path)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, err
	}
	if r.Grant == "" || r.Holder == "" || r.Generation <= 0 || r.Spent < 0 {
		return r, fmt.Errorf("not a spend report: %q", b)
	}
	return r, nil
}

// deliver sends r as its grant's release and says whether it is done with
// (delivered, or never deliverable and set aside).
func (c *Client) deliver(ctx context.Context, path string, r spendReport) bool {
	var ans grantAnswer
	err := c.call(ctx, "release", "/v1/grants/"+r.Grant+"/release", map[string]any{
		"holder": r.Holder, "generation": r.Generation, "spent": strconv.FormatInt(r.Spent, 10),
	}, &ans)
	return c.settle(path, r, ans, err)
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
// this Tally has no such route), and settles each by its own outcome. It
// returns which are done with, by the same rule as deliver.
func (c *Client) deliverAll(ctx context.Context, paths []string, rs []spendReport) []bool {
	if len(rs) == 1 || c.noBatchRelease.Load() {
		return c.deliverEach(ctx, paths, rs)
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
		return c.deliverAll(ctx, paths, rs)
	}
	if errors.As(err, &te) {
		// The call as a whole refused (one report Tally cannot read makes
		// the body invalid): one per call, so only that one is set aside.
		return c.deliverEach(ctx, paths, rs)
	}
	if err == nil && len(ans.Items) != len(rs) {
		err = &unreachableError{fmt.Errorf("release of %d grants answered with %d outcomes", len(rs), len(ans.Items))}
	}
	done := make([]bool, len(rs))
	for i, r := range rs {
		if err != nil {
			done[i] = c.settle(paths[i], r, grantAnswer{}, err)
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
		done[i] = c.settle(paths[i], r, g, itErr)
	}
	return done
}

// deliverEach sends rs one per call, stopping at the first that Tally does
// not take for reachability or load (the rest wait too).
func (c *Client) deliverEach(ctx context.Context, paths []string, rs []spendReport) []bool {
	done := make([]bool, len(rs))
	for i, r := range rs {
		if done[i] = c.deliver(ctx, paths[i], r); !done[i] && (c.paused(time.Now()) || ctx.Err() != nil) {
			break
		}
	}
	return done
}

// settle acts on a release's outcome (ans, err) for the report r kept at
// path, and says whether r is done with.
func (c *Client) settle(path string, r spendReport, ans grantAnswer, err error) bool {
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
	case errors.As(err, &te) && te.Type == problemGrantEnded:
		// Released already: an earlier delivery whose answer was lost.
		c.metrics.reports.WithLabelValues("delivered").Inc()
	case errors.As(err, &te) && te.Type == problemStaleGen:
		// Sent by a newer run for a grant still live: Tally takes it as a
		// late report once the grant is reclaimed. Asked again in a second.
		c.wait(r.Grant, time.Second)
		return false
	case errors.As(err, &te):
		// Never deliverable (another holder's grant, an unknown grant, a
		// spent Tally refuses): kept aside for an operator, and loud.
		c.log.Error("final spend report refused by Tally; set aside", "grant", r.Grant, "spent", r.Spent, "err", err)
		c.metrics.reports.WithLabelValues("rejected").Inc()
		c.setAside(path)
		return true
	default:
		return false // unreachable, refused for load, or out of time: kept
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		c.log.Error("final spend report", "file", path, "err", err)
	}
	return true
}

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

// waiting says a report is not to be sent again yet; wait sets when.
func (c *Client) waiting(grant string) bool {
	c.reportMu.Lock()
	defer c.reportMu.Unlock()
	at, ok := c.reportAt[grant]
	return ok && time.Now().Before(at)
}

func (c *Client) wait(grant string, d time.Duration) {
	c.reportMu.Lock()
	defer c.reportMu.Unlock()
	c.reportAt[grant] = time.Now().Add(d)
}
