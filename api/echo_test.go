package api_test

import (
	"strings"
	"testing"
)

// A problem names what was asked for, clipped: a 10,000-character period
// in a path came back whole in the problem's errors, ten kilobytes of the
// caller's own input per request.
func TestProblemsClipThePeriodAskedFor(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	long := strings.Repeat("x", 10_000)
	f.usage("acme", "api_calls", date("2026-10-15T10:00:00Z"), "10")
	for _, path := range []string{
		"/v1/customers/acme/periods/" + long + "/statement",
		"/v1/customers/acme/periods/2026-" + long + "/statement",
	} {
		r := f.do("GET", path, adminToken, nil)
		if r.status != 400 {
			t.Errorf("%.60s…: %d, want 400", path, r.status)
		}
		if len(r.body) > 2_000 {
			t.Errorf("%.60s…: a problem of %d bytes, want the period clipped: %.300s…", path, len(r.body), r.body)
		}
	}
}
