package admit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// finalReport keeps r on disk (fsynced), then delivers it unless Tally is
// known to be unreachable or asked for a pause: then the loop delivers it
// once Tally answers.
func (c *Client) finalReport(ctx context.Context, r spendReport) {
	path := c.spendPath(r.Grant)
	b, _ := json.Marshal(r)
	if err := writeFileSync(path, b); err != nil {
		// Still sent below; only a crash before Tally has it loses it.
		c.log.Error("final spend report not kept on disk", "grant", r.Grant, "spent", r.Spent, "err", err)
	}
	if c.paused(time.Now()) || ctx.Err() != nil {
		return
	}
	c.deliver(ctx, path, r)
}

// deliverReports sends every kept final spend report (this run's and
// earlier runs'), stopping at the first that Tally does not take for
// reachability or load (force: not before the first, even while paused
// for an unreachable Tally). It returns how many remain and their units.
func (c *Client) deliverReports(ctx context.Context, force bool) (left int, spent int64) {
	paths, _ := filepath.Glob(filepath.Join(c.cfg.Dir, spendPrefix+"*"+spendPending))
	for _, p := range paths {
		r, err := readSpendReport(p)
		if err != nil {
			c.log.Error("final spend report unreadable; set aside", "file", p, "err", err)
			c.setAside(p)
			continue
		}
		if force {
			force = false
			c.reach.pausedUntil.Store(0)
		}
		if c.paused(time.Now()) || ctx.Err() != nil || c.waiting(r.Grant) || !c.deliver(ctx, p, r) {
			left++
			spent += r.Spent
		}
	}
	c.metrics.undelivered.Set(float64(left))
	return left, spent
}

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
