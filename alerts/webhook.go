package alerts

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tally-ledger/tally/internal/ids"
	"github.com/tally-ledger/tally/quota"
	"github.com/tally-ledger/tally/validation"
)

// Webhook is an endpoint events are POSTed to. Its secret is shown once,
// when created or rotated (WebhookSecret).
type Webhook struct {
	Name      string    `json:"name"`
	URL       string    `json:"url"`
	Events    []string  `json:"events"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	RotatedAt time.Time `json:"secret_rotated_at"`
	// PreviousUntil is when the secret replaced by the last rotation stops
	// (or stopped) signing deliveries beside the new one (nil: the last
	// rotation kept none).
	PreviousUntil *time.Time `json:"previous_secret_valid_until"`
}

// WebhookInput is PUT /v1/webhooks/{name}.
type WebhookInput struct {
	Name   string   `json:"-"`
	URL    string   `json:"url"`
	Events []string `json:"events"`
	// AllowPrivate accepts loopback and private addresses
	// (TALLY_WEBHOOK_ALLOW_PRIVATE).
	AllowPrivate bool `json:"-"`
}

// EventTypes are the events a webhook may receive.
var EventTypes = []string{TypeTriggered, TypeResolved}

// KafkaEndpoint names the Kafka delivery of an event; no webhook may take
// the name.
const KafkaEndpoint = "kafka"

// Validate reports every problem of in at once.
func (in WebhookInput) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, validation.Errorf(field, format, args...))
	}
	if !ids.ValidName(in.Name) {
		bad("name", "%q must be "+ids.NameRule, in.Name)
	} else if in.Name == KafkaEndpoint {
		bad("name", "%q names the Kafka delivery (topic tally.alerts); choose another", in.Name)
	}
	if msg := checkURL(in.URL, in.AllowPrivate); msg != "" {
		bad("url", "%s", msg)
	}
	if in.Events != nil && len(in.Events) == 0 {
		bad("events", "is empty; leave it out for every event type")
	}
	for i, e := range in.Events {
		switch {
		case !slices.Contains(EventTypes, e):
			bad(fmt.Sprintf("events[%d]", i), "%q must be %q or %q", e, TypeTriggered, TypeResolved)
		case slices.Contains(in.Events[:i], e):
			bad(fmt.Sprintf("events[%d]", i), "repeats %q", e)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalid, errors.Join(errs...))
}

// checkURL returns what is wrong with a webhook URL, or "". A host name is
// checked again at each connection (its addresses may change).
func checkURL(raw string, allowPrivate bool) string {
	if len(raw) > 2048 {
		return "longer than 2048 characters"
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return fmt.Sprintf("%q is not a URL", raw)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Sprintf("%q must be an http or https URL", raw)
	case u.Host == "" || u.Hostname() == "":
		return fmt.Sprintf("%q has no host", raw)
	case u.User != nil:
		return "must not carry credentials; the signature authenticates Tally"
	case u.Fragment != "":
		return "must not have a fragment"
	}
	if ip, err := netip.ParseAddr(u.Hostname()); err == nil && !allowPrivate && !Public(ip) {
		return fmt.Sprintf("%s is a loopback, private or otherwise local address; Tally refuses it unless TALLY_WEBHOOK_ALLOW_PRIVATE=true", ip)
	}
	// Names are resolved at each connection, whose address is checked
	// then; localhost names (RFC 6761) are refused now, in every spelling.
	if host := strings.TrimSuffix(strings.ToLower(u.Hostname()), "."); !allowPrivate && (host == "localhost" || strings.HasSuffix(host, ".localhost")) {
		return fmt.Sprintf("%s is a loopback name; Tally refuses it unless TALLY_WEBHOOK_ALLOW_PRIVATE=true", u.Hostname())
	}
	return ""
}

// Public reports whether ip is an address a webhook may reach without
// TALLY_WEBHOOK_ALLOW_PRIVATE: a global unicast address outside every
// special-purpose range of IANA's registries (loopback, private, shared,
// link-local, documentation, benchmarking, reserved, discard, the
// deprecated site-local and IPv4-compatible forms, ...). An IPv6 address
// that carries an IPv4 one (IPv4-mapped, NAT64's well-known prefix, 6to4)
// is judged by the IPv4 one: through a NAT64 gateway, 64:ff9b::a00:1
// reaches 10.0.0.1.
func Public(ip netip.Addr) bool {
	ip = ip.Unmap()
	if !ip.IsValid() || !ip.IsGlobalUnicast() || ip.IsPrivate() {
		return false
	}
	if ip.Is6() {
		b := ip.As16()
		switch {
		case nat64.Contains(ip):
			return Public(netip.AddrFrom4([4]byte(b[12:16])))
		case sixToFour.Contains(ip):
			return Public(netip.AddrFrom4([4]byte(b[2:6])))
		}
	}
	for _, p := range notPublic {
		if p.Contains(ip) {
			return false
		}
	}
	return true
}

var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
	// notPublic: the special-purpose ranges IsGlobalUnicast and IsPrivate
	// let through.
	notPublic = func() []netip.Prefix {
		var ps []netip.Prefix
		for _, s := range []string{
			"0.0.0.0/8", "100.64.0.0/10", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "198.18.0.0/15",
			"198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4", "255.255.255.255/32",
			"::/96", "64:ff9b:1::/48", "100::/64", "2001::/23", "2001:db8::/32", "fec0::/10",
		} {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		return ps
	}()
)

func newSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return "whsec_" + hex.EncodeToString(b), nil
}

// PutWebhook creates or changes a webhook. A new webhook's secret is
// returned (secret "" when it existed: its secret is unchanged).
func PutWebhook(ctx context.Context, db DBTX, in WebhookInput, now time.Time) (w Webhook, secret string, created bool, err error) {
	if err := in.Validate(); err != nil {
		return Webhook{}, "", false, err
	}
	if in.Events == nil {
		in.Events = EventTypes
	}
	s, err := newSecret()
	if err != nil {
		return Webhook{}, "", false, err
	}
	now = now.UTC().Truncate(time.Microsecond)
	if err := db.QueryRow(ctx, qPutWebhook, pgx.NamedArgs{"name": in.Name, "url": in.URL, "events": in.Events,
		"secret": s, "at": now}).Scan(&created); err != nil {
		return Webhook{}, "", false, fmt.Errorf("alerts: put webhook: %w", err)
	}
	w, err = GetWebhook(ctx, db, in.Name)
	if err != nil {
		return Webhook{}, "", false, err
	}
	if !created {
		s = ""
	}
	return w, s, created, nil
}

// MaxKeepPrevious is the longest a rotated-out secret keeps signing.
const MaxKeepPrevious = 7 * 24 * time.Hour

// RotateSecret gives the webhook a new secret and returns it (shown once).
// Deliveries from then on are signed with it and, for keepPrevious (0 to
// MaxKeepPrevious), also with the secret it replaces, so a receiver can
// switch to the new secret without refusing a delivery. A secret replaced
// during an earlier overlap stops signing at once. The rotation's time
// and the end of its overlap are Postgres's (now()), the clock the
// dispatcher signs by, whatever the caller's clock says.
func RotateSecret(ctx context.Context, db DBTX, name string, keepPrevious time.Duration) (string, error) {
	if keepPrevious < 0 || keepPrevious > MaxKeepPrevious {
		return "", validation.Errorf("keep_previous_for", "%s must be from 0s to %s", quota.FormatDuration(keepPrevious), quota.FormatDuration(MaxKeepPrevious))
	}
	s, err := newSecret()
	if err != nil {
		return "", err
	}
	var keep *int64
	if keepPrevious > 0 {
		k := keepPrevious.Microseconds()
		keep = &k
	}
	tag, err := db.Exec(ctx, qRotateSecret, pgx.NamedArgs{"name": name, "secret": s, "keep_us": keep})
	if err != nil {
		return "", fmt.Errorf("alerts: rotate secret: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return "", validation.NotFound(ErrNotFound, "no webhook %q", name)
	}
	return s, nil
}

func scanWebhook(row pgx.Row) (Webhook, error) {
	var w Webhook
	err := row.Scan(&w.Name, &w.URL, &w.Events, &w.CreatedAt, &w.UpdatedAt, &w.RotatedAt, &w.PreviousUntil)
	w.CreatedAt, w.UpdatedAt, w.RotatedAt = w.CreatedAt.UTC(), w.UpdatedAt.UTC(), w.RotatedAt.UTC()
	if w.PreviousUntil != nil {
		*w.PreviousUntil = w.PreviousUntil.UTC()
	}
	return w, err
}

// GetWebhook returns one webhook (without its secret).
func GetWebhook(ctx context.Context, db DBTX, name string) (Webhook, error) {
	w, err := scanWebhook(db.QueryRow(ctx, qWebhook, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return Webhook{}, validation.NotFound(ErrNotFound, "no webhook %q", name)
	}
	if err != nil {
		return Webhook{}, fmt.Errorf("alerts: read webhook: %w", err)
	}
	return w, nil
}

// Webhooks returns every webhook (without secrets), by name.
func Webhooks(ctx context.Context, db DBTX) ([]Webhook, error) {
	rows, err := db.Query(ctx, qWebhooks)
	if err != nil {
		return nil, fmt.Errorf("alerts: read webhooks: %w", err)
	}
	ws, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Webhook, error) { return scanWebhook(row) })
	if err != nil {
		return nil, fmt.Errorf("alerts: read webhooks: %w", err)
	}
	return ws, nil
}

// endpointConfig is a webhook as the dispatcher and evaluator need it.
type endpointConfig struct {
	url    string
	events []string
	secret string
	// previous is the secret the last rotation replaced, while its
	// overlap lasts ("" otherwise).
	previous string
}

func loadEndpoints(ctx context.Context, db DBTX) (map[string]endpointConfig, error) {
	rows, err := db.Query(ctx, qWebhookSecrets)
	if err != nil {
		return nil, fmt.Errorf("alerts: read webhooks: %w", err)
	}
	defer rows.Close()
	out := map[string]endpointConfig{}
	for rows.Next() {
		var name string
		var c endpointConfig
		var previous *string
		if err := rows.Scan(&name, &c.url, &c.events, &c.secret, &previous); err != nil {
			return nil, fmt.Errorf("alerts: read webhooks: %w", err)
		}
		if previous != nil {
			c.previous = *previous
		}
		out[name] = c
	}
	return out, rows.Err()
}

// WebhookInUseError refuses to delete a webhook that live rules name.
type WebhookInUseError struct {
	Webhook string
	Rules   []string
}

func (e *WebhookInUseError) Error() string {
	return fmt.Sprintf("alerts: webhook %q is an endpoint of the alert rules %s; change or delete them first", e.Webhook, strings.Join(e.Rules, ", "))
}

// DeleteWebhook deletes a webhook no live rule names. Its pending
// deliveries become failed (listed with state=failed; redelivering them
// needs a webhook of that name again).
func DeleteWebhook(ctx context.Context, db TxBeginner, name string) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		// Rule writes that name the webhook check that it exists: lock
		// its row first, so none commits between the check and the delete.
		var one int
		err := tx.QueryRow(ctx, qLockWebhook, name).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return validation.NotFound(ErrNotFound, "no webhook %q", name)
		}
		if err != nil {
			return fmt.Errorf("alerts: delete webhook: %w", err)
		}
		var users []string
		if err := tx.QueryRow(ctx, qWebhookUsers, name).Scan(&users); err != nil {
			return fmt.Errorf("alerts: delete webhook: %w", err)
		}
		if len(users) > 0 {
			return &WebhookInUseError{Webhook: name, Rules: users}
		}
		if _, err := tx.Exec(ctx, qFailDeliveriesOf, name); err != nil {
			return fmt.Errorf("alerts: delete webhook: %w", err)
		}
		if _, err := tx.Exec(ctx, qDeleteWebhook, name); err != nil {
			return fmt.Errorf("alerts: delete webhook: %w", err)
		}
		return nil
	})
}
