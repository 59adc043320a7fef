package admit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// CheckError says what Check found wrong, in words a newcomer can act on.
type CheckError struct {
	URL string
	// Problem is one of: unreachable (nothing answers at URL), not-tally
	// (something answers that is not Tally's API), unknown-token,
	// wrong-token-kind (not a gateway or admin token), holder-not-allowed
	// (a gateway token for another holder), overloaded, server-error.
	Problem string
	Detail  string
}

func (e *CheckError) Error() string {
	return fmt.Sprintf("admit: check %s: %s: %s", e.URL, e.Problem, e.Detail)
}

// Check validates cfg and reaches Tally with its token, as a gateway's
// start-up check: it returns the Config's field errors, or a *CheckError
// that names what is wrong (nothing listening, not Tally, an unknown
// token, a token that is not a gateway token, a gateway token for another
// holder), or nil when Admit can get grants as cfg.Holder. It sends a
// grant request that Tally refuses as invalid (amount 0) after
// authenticating it: nothing is written. Bounded by ctx (and the
// HTTPClient's timeout, 2 s by default).
func Check(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("admit: invalid Config: %w", err)
	}
	base := strings.TrimRight(cfg.URL, "/")
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: 2 * time.Second}
	}
	fail := func(problem, format string, args ...any) error {
		return &CheckError{URL: base, Problem: problem, Detail: fmt.Sprintf(format, args...)}
	}
	body, _ := json.Marshal(map[string]any{"holder": cfg.Holder, "generation": 1, "customer": "check",
		"meter": "check", "amount": "0"})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/grants", bytes.NewReader(body))
	if err != nil {
		return fail("unreachable", "%v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+cfg.Token)
	resp, err := hc.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return fail("unreachable", "nothing listens there (%v): is Tally running (tally serve --api), and is the port right?", op.Err)
		}
		return fail("unreachable", "no answer: %v", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var p struct {
		Type   string         `json:"type"`
		Detail string         `json:"detail"`
		Errors []problemField `json:"errors"`
	}
	isProblem := json.Unmarshal(raw, &p) == nil && strings.HasPrefix(p.Type, "urn:tally:problem:")
	switch {
	case !isProblem:
		return fail("not-tally", "POST /v1/grants answered %s without a Tally problem: is URL Tally's API (no path prefix)?", resp.Status)
	case resp.StatusCode == http.StatusBadRequest:
		return nil // authenticated and allowed: only the probe's amount 0 was refused
	case resp.StatusCode == http.StatusUnauthorized:
		return fail("unknown-token", "Tally does not know Token (unknown or revoked): create a gateway token with tally tokens create --gateway %s", cfg.Holder)
	case resp.StatusCode == http.StatusForbidden && hasField(p.Errors, "holder"):
		return fail("holder-not-allowed", "Token is a gateway token for another holder (%s): Holder must be its gateway, or create one with tally tokens create --gateway %s", p.Detail, cfg.Holder)
	case resp.StatusCode == http.StatusForbidden:
		return fail("wrong-token-kind", "Token is not a gateway token (a customer token?): create one with tally tokens create --gateway %s", cfg.Holder)
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
		return fail("overloaded", "Tally refused for load (%s): %s", resp.Status, p.Detail)
	case resp.StatusCode >= 500:
		return fail("server-error", "Tally answered %s: %s", resp.Status, p.Detail)
	}
	return fail("not-tally", "POST /v1/grants answered %s (%s): %s", resp.Status, p.Type, p.Detail)
}

type problemField struct {
	Field string `json:"field"`
}

func hasField(errs []problemField, field string) bool {
	for _, e := range errs {
		if e.Field == field {
			return true
		}
	}
	return false
}
