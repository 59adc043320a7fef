package chaosbench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"
)

// grantPath is how the gateways ask for and release grants: the admission
// store in process, or the REST API of an API process (Config.Process).
type grantPath interface {
	// issue returns the grant's id and amount; exhausted reports a refusal
	// at the limit (409 budget-exhausted).
	issue(ctx context.Context, holder string, amount decimal.Decimal) (id uuid.UUID, granted decimal.Decimal, exhausted bool, err error)
	release(ctx context.Context, holder string, id uuid.UUID, spent decimal.Decimal) error
}

// restPath calls POST /v1/grants and POST /v1/grants/{id}/release of an API
// process, each gateway with its own gateway token.
type restPath struct {
	base   string            // http://host:port
	tokens map[string]string // holder → gateway token
	client *http.Client
}

func (p *restPath) post(ctx context.Context, holder, path string, body any) (int, []byte, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.base+path, bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+p.tokens[holder])
	req.Header.Set("Content-Type", "application/json")
	res, err := p.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	out, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	return res.StatusCode, out, err
}

func (p *restPath) issue(ctx context.Context, holder string, amount decimal.Decimal) (uuid.UUID, decimal.Decimal, bool, error) {
	status, body, err := p.post(ctx, holder, "/v1/grants", map[string]any{"holder": holder, "generation": 1,
		"customer": grantCustomer, "meter": grantMeter, "amount": amount.String(), "min_amount": "1", "ttl": "2s"})
	if err != nil {
		return uuid.Nil, decimal.Zero, false, err
	}
	switch status {
	case http.StatusCreated:
	case http.StatusConflict:
		var pr struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(body, &pr) == nil && pr.Type == "urn:tally:problem:budget-exhausted" {
			return uuid.Nil, decimal.Zero, true, nil
		}
		return uuid.Nil, decimal.Zero, false, fmt.Errorf("POST /v1/grants: %d %s", status, body)
	default:
		return uuid.Nil, decimal.Zero, false, fmt.Errorf("POST /v1/grants: %d %s", status, body)
	}
	var g struct {
		ID     uuid.UUID       `json:"id"`
		Amount decimal.Decimal `json:"amount"`
	}
	if err := json.Unmarshal(body, &g); err != nil {
		return uuid.Nil, decimal.Zero, false, fmt.Errorf("POST /v1/grants: %w: %s", err, body)
	}
	return g.ID, g.Amount, false, nil
}

func (p *restPath) release(ctx context.Context, holder string, id uuid.UUID, spent decimal.Decimal) error {
	status, body, err := p.post(ctx, holder, "/v1/grants/"+id.String()+"/release",
		map[string]any{"holder": holder, "generation": 1, "spent": spent.String()})
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("POST /v1/grants/%s/release: %d %s", id, status, body)
	}
	return nil
}

// newRESTPath is the grant path through the API process at listen.
func newRESTPath(listen string, tokens map[string]string) *restPath {
	return &restPath{base: "http://" + listen, tokens: tokens, client: &http.Client{Timeout: 5 * time.Second}}
}
