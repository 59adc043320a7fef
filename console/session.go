package console

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"math"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tally-ledger/tally/api"
)

const (
	sessionCookie = "tally_console"
	// signInCookie holds the sign-in form's CSRF token before there is a
	// session (double submit: the form must carry the same value).
	signInCookie = "tally_console_sign_in"
	csrfField    = "csrf"
)

// viewer is who is looking: the admin, or one customer.
type viewer struct {
	Admin    bool
	Customer string
}

// canRead reports whether v may see customer's pages.
func (v viewer) canRead(customer string) bool { return v.Admin || v.Customer == customer }

// identify checks a token and takes cost requests from its per-token
// limit (shared with its REST requests). It is the console's one call into
// the token check, kept here so that it can follow the check wherever it
// lives.
func (c *Console) identify(ctx context.Context, token string, cost int) (viewer, error) {
	caller, err := c.api.IdentifyCharged(ctx, token, cost)
	if err != nil {
		return viewer{}, err
	}
	if !caller.Admin && caller.Customer == "" {
		return viewer{}, errGatewayToken
	}
	return viewer{Admin: caller.Admin, Customer: caller.Customer}, nil
}

var errGatewayToken = errors.New("a gateway token manages grants and cannot sign in to the console; use the admin token or a customer token")

// refusedToken reports whether err says the token is unknown or revoked
// (or a gateway's), as opposed to a failure to check it.
func refusedToken(err error) bool {
	if errors.Is(err, errGatewayToken) {
		return true
	}
	var p *api.Problem
	return errors.As(err, &p) && p.Status == http.StatusUnauthorized
}

// session is a signed-in browser. The token is kept (in memory only) so
// that each request checks it again: revoking it ends the session.
type session struct {
	token   string
	owner   [32]byte // the token's hash: whose session it is
	seq     uint64   // order of creation: the oldest is ended first
	csrf    string
	expires time.Time
}

// sessions are kept in memory: a restart signs everyone out. Behind a
// load balancer, route a browser to one process (sticky sessions).
type sessions struct {
	mu       sync.Mutex
	m        map[string]*session
	ttl      time.Duration
	max      int
	perToken int
	seq      uint64
}

func newSessions(ttl time.Duration, max, perToken int) *sessions {
	return &sessions{m: map[string]*session{}, ttl: ttl, max: max, perToken: perToken}
}

// errSessionsFull: the table is full of live sessions; a sign-in never
// ends another token's session to make room.
var errSessionsFull = errors.New("console: as many sessions as may be kept are signed in")

// create starts a session for token and returns its id. A token at its
// own bound ends its oldest session; a full table refuses
// (errSessionsFull) rather than end another token's.
func (s *sessions) create(token string, now time.Time) (string, *session, error) {
	id := rand.Text() + rand.Text() // 260 bits
	sess := &session{token: token, owner: sha256.Sum256([]byte(token)), csrf: rand.Text() + rand.Text(), expires: now.Add(s.ttl)}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	sess.seq = s.seq
	var own []string
	for k, v := range s.m {
		switch {
		case !v.expires.After(now):
			delete(s.m, k)
		case v.owner == sess.owner:
			own = append(own, k)
		}
	}
	if len(own) >= s.perToken {
		slices.SortFunc(own, func(a, b string) int { return cmp.Compare(s.m[a].seq, s.m[b].seq) })
		for _, k := range own[:len(own)-s.perToken+1] {
			delete(s.m, k)
		}
	}
	if len(s.m) >= s.max {
		return "", nil, errSessionsFull
	}
	s.m[id] = sess
	return id, sess, nil
}

func (s *sessions) get(id string, now time.Time) (*session, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.m[id]
	if ok && !sess.expires.After(now) {
		delete(s.m, id)
		return nil, false
	}
	return sess, ok
}

func (s *sessions) end(id string) {
	s.mu.Lock()
	delete(s.m, id)
	s.mu.Unlock()
}

type ctxKey struct{}

// request is what the authenticate middleware found.
type request struct {
	viewer
	sessionID string
	csrf      string
}

func requestFrom(ctx context.Context) request {
	r, _ := ctx.Value(ctxKey{}).(request)
	return r
}

// authenticate finds the session and checks its token; without one, a
// GET (or HEAD) is sent to the sign-in page (and back after it), anything
// else is refused.
func (c *Console) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var sess *session
		var id string
		if ck, err := r.Cookie(sessionCookie); err == nil {
			id = ck.Value
			sess, _ = c.sessions.get(id, c.now())
		}
		// A form's CSRF check comes before the token's: a form another
		// site posts takes nothing from the token's per-token limit.
		if sess != nil && r.Method == http.MethodPost && !c.checkCSRF(w, r, sess.csrf) {
			return
		}
		var v viewer
		var err error
		if sess != nil {
			v, err = c.identify(r.Context(), sess.token, pageCost(r))
			if err != nil && !refusedToken(err) {
				c.fail(w, r, err)
				return
			}
			if err != nil {
				c.sessions.end(id) // revoked since sign-in
				sess = nil
			}
		}
		if sess == nil {
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				c.render(w, r, http.StatusForbidden, "error", errorPage{Title: "Signed out",
					Detail: "Your session has ended. Sign in again and repeat what you did."})
				return
			}
			http.Redirect(w, r, Prefix+"/sign-in?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		ctx := context.WithValue(r.Context(), ctxKey{}, request{viewer: v, sessionID: id, csrf: sess.csrf})
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// checkCSRF refuses a POST sent from another site or without the form's
// token (want), and says so on a 403 page.
func (c *Console) checkCSRF(w http.ResponseWriter, r *http.Request, want string) bool {
	site := r.Header.Get("Sec-Fetch-Site")
	crossSite := site != "" && site != "same-origin"
	got := r.PostFormValue(csrfField)
	if crossSite || want == "" || subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		c.render(w, r, http.StatusForbidden, "error", errorPage{Title: "Form expired or sent from elsewhere",
			Detail: "This form did not carry this session's check (CSRF token), or came from another site. Reload the page and try again."})
		return false
	}
	return true
}

// safeNext is where to go after sign-in: a console path, never another
// host nor another path of this one. The path is decoded and cleaned
// before its prefix is checked ("/console/../v1/x" is "/v1/x"), and the
// cleaned path is what the redirect names. A next longer than maxNext (no
// console page's address is) is home too: the sign-in form carries next
// back, and a 10,000-character one is not echoed.
func safeNext(next string) string {
	home := Prefix + "/"
	if len(next) > maxNext || strings.ContainsAny(next, "\\\r\n") || !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") {
		return home
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" || strings.Contains(u.Path, "//") {
		return home
	}
	clean := path.Clean(u.Path)
	if strings.HasSuffix(u.Path, "/") && clean != "/" {
		clean += "/"
	}
	if !strings.HasPrefix(clean, home) { // Prefix itself too: the cookie's path is home
		return home
	}
	return (&url.URL{Path: clean, RawQuery: u.RawQuery}).String()
}

// maxNext bounds where sign-in may return to, in bytes: a console page's
// path and query, ids of ids.MaxLen characters included, are far shorter.
const maxNext = 1024

type signInView struct {
	CSRF, Next, Error string
	Status            int
}

func (c *Console) signInPage(w http.ResponseWriter, r *http.Request) {
	c.showSignIn(w, r, http.StatusOK, "")
}

func (c *Console) showSignIn(w http.ResponseWriter, r *http.Request, status int, problem string) {
	// One value per browser, kept across reloads and tabs, and always one
	// the server issued: a cookie the client planted is replaced.
	token := ""
	if ck, err := r.Cookie(signInCookie); err == nil && c.issuedSignIn(ck.Value) {
		token = ck.Value
	} else {
		token = c.newSignIn()
	}
	http.SetCookie(w, &http.Cookie{Name: signInCookie, Value: token, Path: Prefix + "/sign-in", HttpOnly: true,
		Secure: c.secureCookie(r), SameSite: http.SameSiteStrictMode, MaxAge: 3600})
	next := r.URL.Query().Get("next")
	if r.Method == http.MethodPost {
		next = r.PostFormValue("next")
	}
	c.render(w, r, status, "sign-in", signInView{CSRF: token, Next: safeNext(next), Error: problem})
}

// newSignIn is a sign-in CSRF value: a random nonce and its MAC under the
// console's key, so that only values the server issued are accepted.
func (c *Console) newSignIn() string {
	nonce := rand.Text()
	return nonce + "." + c.signInMAC(nonce)
}

// issuedSignIn reports whether v is a value newSignIn returned.
func (c *Console) issuedSignIn(v string) bool {
	nonce, mac, ok := strings.Cut(v, ".")
	return ok && len(nonce) == 26 && hmac.Equal([]byte(mac), []byte(c.signInMAC(nonce)))
}

func (c *Console) signInMAC(nonce string) string {
	m := hmac.New(sha256.New, c.csrfKey[:])
	m.Write([]byte("tally console sign-in\x00" + nonce))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// tooManySignIns answers a sign-in over a limit: 429 with Retry-After.
func (c *Console) tooManySignIns(w http.ResponseWriter, r *http.Request, wait time.Duration, detail string) {
	c.metrics.signIns.WithLabelValues("limited").Inc()
	w.Header().Set("Retry-After", strconv.FormatInt(max(1, int64(math.Ceil(wait.Seconds()))), 10))
	c.render(w, r, http.StatusTooManyRequests, "error", errorPage{Title: "Too many sign-ins", Detail: detail})
}

// signIn exchanges a token for a session cookie.
func (c *Console) signIn(w http.ResponseWriter, r *http.Request) {
	pre, err := r.Cookie(signInCookie)
	want := ""
	if err == nil && c.issuedSignIn(pre.Value) {
		want = pre.Value
	}
	if !c.checkCSRF(w, r, want) {
		c.metrics.signIns.WithLabelValues("csrf").Inc()
		return
	}
	// Only forms that pass the CSRF check count against the address: a
	// page on another site posting here cannot use up a user's sign-ins.
	now := time.Now()
	if ok, wait := c.signInAddrs.Allow(api.ClientAddress(r), now); !ok {
		c.tooManySignIns(w, r, wait, "This address has tried to sign in too often. Wait a little and try again.")
		return
	}
	token := strings.TrimSpace(r.PostFormValue("token"))
	if token == "" {
		c.showSignIn(w, r, http.StatusBadRequest, "Enter a token: the admin token or a customer token.")
		return
	}
	h := sha256.Sum256([]byte(token))
	if ok, wait := c.signInTokens.Allow(string(h[:]), now); !ok {
		c.tooManySignIns(w, r, wait, "This token has signed in too often. Wait a little and try again.")
		return
	}
	v, err := c.identify(r.Context(), token, 1)
	if err != nil {
		if !refusedToken(err) {
			c.fail(w, r, err)
			return
		}
		c.metrics.signIns.WithLabelValues("refused").Inc()
		c.log.InfoContext(r.Context(), "console: sign-in refused", "remote", r.RemoteAddr, "reason", err.Error())
		detail := "This token is unknown or revoked."
		if errors.Is(err, errGatewayToken) {
			detail = "A gateway token cannot sign in: use the admin token or a customer token."
		}
		c.showSignIn(w, r, http.StatusUnauthorized, detail)
		return
	}
	outcome := "customer"
	if v.Admin {
		outcome = "admin"
	}
	c.metrics.signIns.WithLabelValues(outcome).Inc()
	id, _, err := c.sessions.create(token, c.now())
	if err != nil {
		c.metrics.signIns.WithLabelValues("full").Inc()
		w.Header().Set("Retry-After", "60")
		c.render(w, r, http.StatusServiceUnavailable, "error", errorPage{Title: "Too many sessions",
			Detail: "As many people as this console keeps sessions for are signed in. Try again later."})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: id, Path: Prefix + "/", HttpOnly: true,
		Secure: c.secureCookie(r), SameSite: http.SameSiteStrictMode, MaxAge: int(c.sessions.ttl.Seconds())})
	http.SetCookie(w, &http.Cookie{Name: signInCookie, Value: "", Path: Prefix + "/sign-in", MaxAge: -1,
		HttpOnly: true, Secure: c.secureCookie(r), SameSite: http.SameSiteStrictMode})
	next := safeNext(r.PostFormValue("next"))
	if !v.Admin && next == Prefix+"/" {
		next = customerPath(v.Customer)
	}
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (c *Console) signOut(w http.ResponseWriter, r *http.Request) error {
	c.sessions.end(requestFrom(r.Context()).sessionID)
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: Prefix + "/", MaxAge: -1,
		HttpOnly: true, Secure: c.secureCookie(r), SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, Prefix+"/sign-in", http.StatusSeeOther)
	return nil
}

// secureCookie: whether cookies set in answer to r are Secure.
func (c *Console) secureCookie(r *http.Request) bool { return c.secure || r.TLS != nil }

func customerPath(customer string) string { return Prefix + "/customers/" + url.PathEscape(customer) }
