package console

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/forwarder/forwarder/internal/outboxdb"
	"github.com/forwarder/forwarder/internal/plural"
)

// layout is what every page gets besides its own data.
type layout struct {
	Title    string
	Nav      string
	Operator string
	// Open is set when no token is configured (loopback, open to local users).
	Open     bool
	ReadOnly bool
	CSRF     string
	Flash    string
	Page     any
}

var funcs = template.FuncMap{
	"when": func(t any) string {
		switch v := t.(type) {
		case time.Time:
			return v.UTC().Format("2006-01-02 15:04:05Z")
		case *time.Time:
			if v == nil {
				return "–"
			}
			return v.UTC().Format("2006-01-02 15:04:05Z")
		}
		return "–"
	},
	"age": func(d time.Duration) string { return outboxdb.FormatDuration(d.Round(time.Second)) },
	"s": func(p any) string {
		switch v := p.(type) {
		case *string:
			if v == nil {
				return "–"
			}
			return SafeText(*v)
		case *int32:
			if v == nil {
				return "–"
			}
			return strconv.Itoa(int(*v))
		case string:
			return SafeText(v)
		}
		return fmt.Sprint(p)
	},
	"perSec": func(n int64, window int) string {
		return strconv.FormatFloat(float64(n)/float64(window), 'f', 1, 64)
	},
	"lower": strings.ToLower,
	"quote": strconv.Quote,
	// plural is n with the noun for it: "1 row", "2 rows".
	"plural": func(n any, one, many string) string {
		s := fmt.Sprint(n)
		if s == "1" {
			return "1 " + one
		}
		return s + " " + many
	},
	"list": func(vs ...string) []string { return vs },
	"dict": func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	},
}

func parsePages() (map[string]*template.Template, error) {
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, n := range names {
		name := strings.TrimSuffix(path.Base(n), ".html")
		if name == "layout" {
			continue
		}
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", n)
		if err != nil {
			return nil, fmt.Errorf("console: parsing %s: %w", n, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// render executes a page into a buffer first, so a template error becomes a
// clean 500 rather than half a page.
func (s *Server) render(w http.ResponseWriter, r *http.Request, status int, name string, data any) {
	op := operatorOf(r)
	l := layout{Title: name, Nav: name, Operator: op, Open: s.cfg.Token == "", ReadOnly: s.cfg.ReadOnly,
		CSRF: s.csrfToken(op), Flash: s.flashOf(r), Page: data}
	var buf bytes.Buffer
	if err := s.pages[name].Execute(&buf, l); err != nil {
		s.log.Error("console: rendering page", "page", name, "error", err)
		http.Error(w, "console: rendering the page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// handlerFunc renders one page: it returns the template and its data.
type handlerFunc func(w http.ResponseWriter, r *http.Request) (page string, data any, err error)

// httpError is an error with the status to answer.
type httpError struct {
	status int
	msg    string
}

func (e httpError) Error() string { return e.msg }

// requestTimeout bounds a whole request: a few statements, each bounded by
// the statement timeout.
func (s *Server) requestTimeout() time.Duration {
	return 3 * s.statementTimeout()
}

// statementTimeout bounds each statement of a page (--timeout).
func (s *Server) statementTimeout() time.Duration {
	if s.cfg.StatementTimeout <= 0 {
		return outboxdb.DefaultLookupTimeout
	}
	return s.cfg.StatementTimeout
}

func (s *Server) page(h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), s.requestTimeout())
		defer cancel()
		r = r.WithContext(ctx)
		name, data, err := h(w, r)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		if name != "" {
			s.render(w, r, http.StatusOK, name, data)
		}
	})
}

// action wraps a POST that changes rows: refused when read-only or without
// the CSRF token.
func (s *Server) action(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.ReadOnly {
			http.Error(w, "console: read-only (--read-only): actions are disabled", http.StatusForbidden)
			return
		}
		if !parseForm(w, r) {
			return
		}
		if !s.checkCSRF(r) {
			http.Error(w, "console: the form is stale or came from elsewhere (CSRF check failed): reload the page", http.StatusForbidden)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), s.requestTimeout())
		defer cancel()
		h(w, r.WithContext(ctx))
	})
}

type errorData struct {
	Status  int
	Message string
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	if he, ok := errors.AsType[httpError](err); ok {
		s.render(w, r, he.status, "error", errorData{he.status, he.msg})
		return
	}
	err = outboxdb.WhenReadOnly(s.pool, err)
	s.log.Error("console: request failed", "path", r.URL.Path, "error", err)
	status, msg := s.publicError(err)
	s.render(w, r, status, "error", errorData{status, msg})
}

// queryCanceled is PostgreSQL's SQLSTATE for a statement stopped by
// statement_timeout.
const queryCanceled = "57014"

// publicError is what a page says of an error from the database: the
// status and a sentence a browser may show. The driver's own text stays in
// the log: a connection error names the database user, database and host.
func (s *Server) publicError(err error) (int, string) {
	pgErr, fromServer := errors.AsType[*pgconn.PgError](err)
	if _, connecting := errors.AsType[*pgconn.ConnectError](err); connecting {
		// The server's refusal of a login is a PgError too.
		fromServer = false
	}
	switch {
	case errors.Is(err, outboxdb.ErrReadOnly):
		return http.StatusServiceUnavailable, "The database accepts no writes (a standby, or default_transaction_read_only is on): " +
			"the console's database URL must lead to the primary; with several hosts, add target_session_attrs=read-write."
	case errors.Is(err, context.DeadlineExceeded) || fromServer && pgErr.Code == queryCanceled:
		return http.StatusServiceUnavailable, fmt.Sprintf("The database took longer than the console waits "+
			"(each statement %s, a request %s; --timeout), and the request was stopped.",
			s.statementTimeout(), s.requestTimeout())
	case fromServer:
		return http.StatusInternalServerError, "The database refused the request: " + SafeText(pgErr.Message)
	default:
		return http.StatusServiceUnavailable, "The console cannot use the database right now; its log has the driver's error."
	}
}

func (s *Server) lookupOpts() outboxdb.LookupOptions {
	return outboxdb.LookupOptions{Timeout: s.cfg.StatementTimeout}
}

// readOnly runs fn in one bounded read-only transaction.
func (s *Server) readOnly(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return outboxdb.ReadOnly(ctx, s.pool, s.lookupOpts(), fn)
}

// countRequeue counts what a requeue of f would take, for its
// confirmation page, bounded as the lookups are.
func (s *Server) countRequeue(ctx context.Context, f outboxdb.RequeueFilter) (c outboxdb.RequeueCount, err error) {
	err = s.readOnly(ctx, func(tx pgx.Tx) error {
		c, err = outboxdb.CountRequeue(ctx, tx, f)
		return err
	})
	return c, err
}

type overviewData struct {
	Gauges  outboxdb.RecordGauges
	Oldest  *outboxdb.OldestRow
	Rates   outboxdb.Rates
	State   outboxdb.SharedState
	Classes []outboxdb.ValueCount
	Groups  []outboxdb.FailedGroup
	Actions []outboxdb.OperatorAction
}

func (s *Server) overview(_ http.ResponseWriter, r *http.Request) (string, any, error) {
	ctx := r.Context()
	var d overviewData
	var err error
	if d.Gauges, err = outboxdb.ReadRecordGauges(ctx, s.pool, outboxdb.GaugeOptions{}); err != nil {
		return "", nil, err
	}
	err = s.readOnly(ctx, func(tx pgx.Tx) error {
		var err error
		if d.Oldest, err = outboxdb.OldestUnfinished(ctx, tx); err != nil {
			return err
		}
		if d.Rates, err = outboxdb.ReadRates(ctx, tx); err != nil {
			return err
		}
		if d.State, err = outboxdb.ReadSharedState(ctx, tx); err != nil {
			return err
		}
		if d.Classes, err = outboxdb.FailedByClass(ctx, tx); err != nil {
			return err
		}
		if d.Groups, err = outboxdb.FailedGroups(ctx, tx, 10); err != nil {
			return err
		}
		d.Actions, err = outboxdb.RecentOperatorActions(ctx, tx, 10)
		return err
	})
	return "overview", d, err
}

type failedData struct {
	Classes []outboxdb.ValueCount
	Groups  []outboxdb.FailedGroup
	Limit   int
	// Failed counts the FAILED rows; past Cap the groups cover the latest.
	Failed, Cap int64
}

func (s *Server) failed(_ http.ResponseWriter, r *http.Request) (string, any, error) {
	ctx := r.Context()
	d := failedData{Limit: groupLimit, Cap: outboxdb.FailedGroupsCap}
	err := s.readOnly(ctx, func(tx pgx.Tx) error {
		var err error
		if d.Classes, err = outboxdb.FailedByClass(ctx, tx); err != nil {
			return err
		}
		for _, c := range d.Classes {
			d.Failed += c.Rows
		}
		d.Groups, err = outboxdb.FailedGroups(ctx, tx, groupLimit)
		return err
	})
	return "failed", d, err
}

type searchData struct {
	Form   url.Values
	Filter string
	Rows   []outboxdb.FoundRow
	Limit  int
	Error  string
	Ran    bool
}

func (s *Server) search(_ http.ResponseWriter, r *http.Request) (string, any, error) {
	q := r.URL.Query()
	d := searchData{Form: q}
	if len(q) == 0 {
		// The empty form: nothing searched yet.
		return "search", d, nil
	}
	f := outboxdb.FindFilter{Plate: strings.TrimSpace(q.Get("plate")), Park: strings.TrimSpace(q.Get("park")),
		Berth: strings.TrimSpace(q.Get("berth")), Device: strings.TrimSpace(q.Get("device")),
		Status: outboxdb.Status(q.Get("status")), Errcode: strings.TrimSpace(q.Get("errcode"))}
	var err error
	now := time.Now()
	if f.Since, err = ParseWhen(q.Get("since"), now); err != nil {
		d.Error = "since: " + err.Error()
		return "search", d, nil
	}
	if f.Until, err = ParseWhen(q.Get("until"), now); err != nil {
		d.Error = "until: " + err.Error()
		return "search", d, nil
	}
	if l := q.Get("limit"); l != "" {
		// Empty is the default; 0 is not (the find command refuses it too).
		if f.Limit, err = strconv.Atoi(l); err != nil || f.Limit < 1 || f.Limit > outboxdb.MaxFindLimit {
			d.Error = fmt.Sprintf("limit %q: want 1 to %d", l, outboxdb.MaxFindLimit)
			return "search", d, nil
		}
	}
	if err := f.Validate(); err != nil {
		d.Error = err.Error()
		return "search", d, nil
	}
	d.Limit = f.Limit
	if d.Limit == 0 {
		d.Limit = outboxdb.DefaultFindLimit
	}
	d.Filter = f.String()
	d.Ran = true
	d.Rows, err = outboxdb.Find(r.Context(), s.pool, f, s.lookupOpts())
	return "search", d, err
}

type recordData struct {
	outboxdb.RecordView
	Payload Payload
	Preview Preview
	// Requeueable: FAILED, so the requeue action applies.
	Requeueable bool
}

func (s *Server) loadRecord(r *http.Request) (outboxdb.RecordView, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange):
		return outboxdb.RecordView{}, httpError{http.StatusNotFound, fmt.Sprintf("no row with id %s: ids are below 2^63", r.PathValue("id"))}
	case err != nil:
		return outboxdb.RecordView{}, httpError{http.StatusNotFound, "no such row: the id is not a number"}
	}
	v, err := outboxdb.ShowRecordByID(r.Context(), s.pool, id, s.lookupOpts())
	if errors.Is(err, outboxdb.ErrNoRecord) {
		return v, httpError{http.StatusNotFound, fmt.Sprintf("no row with id %d (it may have been purged)", id)}
	}
	return v, err
}

func (s *Server) record(_ http.ResponseWriter, r *http.Request) (string, any, error) {
	v, err := s.loadRecord(r)
	if err != nil {
		return "", nil, err
	}
	return "record", recordData{RecordView: v, Payload: RenderPayload(v.Payload, PayloadLimit),
		Preview: PreviewRequest(s.cfg.MappingsDir, v.Record), Requeueable: v.Status == outboxdb.StatusFailed}, nil
}

// rowFilter selects one FAILED row by its key, whatever its class: the
// operator picked this very row, having seen its class on the
// confirmation page.
func rowFilter(rec outboxdb.Record) outboxdb.RequeueFilter {
	return outboxdb.RequeueFilter{Statuses: []outboxdb.Status{outboxdb.StatusFailed}, Keys: []string{rec.MessageKey},
		Classes: []outboxdb.FailureClass{outboxdb.ClassTransient, outboxdb.ClassRejected, outboxdb.ClassInvalid}}
}

type confirmRowData struct {
	outboxdb.RecordView
	Rows int64
}

func (s *Server) confirmRequeueRow(_ http.ResponseWriter, r *http.Request) (string, any, error) {
	if s.cfg.ReadOnly {
		return "", nil, httpError{http.StatusForbidden, "read-only console: actions are disabled"}
	}
	v, err := s.loadRecord(r)
	if err != nil {
		return "", nil, err
	}
	c, err := s.countRequeue(r.Context(), rowFilter(v.Record))
	if err != nil {
		return "", nil, err
	}
	return "confirm_row", confirmRowData{RecordView: v, Rows: c.Rows}, nil
}

func (s *Server) requeueRow(w http.ResponseWriter, r *http.Request) {
	v, err := s.loadRecord(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	op := operatorOf(r)
	n, err := s.requeue(r.Context(), op, rowFilter(v.Record),
		fmt.Sprintf("console: row %d key=%s", v.ID, strconv.Quote(v.MessageKey)))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	done := "Requeued: the row is PENDING and due now."
	if n == 0 {
		done = "Nothing requeued: the row is no longer FAILED."
	}
	http.Redirect(w, r, fmt.Sprintf("/records/%d?%s", v.ID, s.flashQuery(done)), http.StatusSeeOther)
}

// requeue requeues and records who did it, in forward_operator_log and in
// each row's REQUEUED attempt log.
func (s *Server) requeue(ctx context.Context, op string, f outboxdb.RequeueFilter, desc string) (int64, error) {
	n, err := outboxdb.Requeue(ctx, s.pool, f, outboxdb.RequeueOptions{Note: "requeued by " + op + " (console)"})
	if _, auditErr := outboxdb.LogOperatorAction(context.WithoutCancel(ctx), s.pool, outboxdb.OperatorAction{
		Operator: op, Action: outboxdb.ActionRequeue, Filter: desc, Rows: n}); auditErr != nil {
		err = errors.Join(err, auditErr)
	}
	s.log.Info("console requeue", "operator", op, "filter", desc, "rows", n, "error", err)
	return n, err
}

// groupFilter selects a group of FAILED rows: its class and reason.
func groupFilter(class, reason string) outboxdb.RequeueFilter {
	f := outboxdb.RequeueFilter{Statuses: []outboxdb.Status{outboxdb.StatusFailed}, Reason: &reason}
	if class != "" {
		f.Classes = []outboxdb.FailureClass{outboxdb.FailureClass(class)}
	}
	return f
}

type confirmGroupData struct {
	Class, Reason string
	Rows          int64
}

// groupParams reads a group of FAILED rows from a request, its class and
// reason, and refuses a group no row can be in. The confirmation form sends
// the reason quoted (reason_q): a reason with a newline (a platform's reply
// of several lines) comes back from a browser with CR LF and matched no row.
// A script may still post it as it is (reason).
func groupParams(get func(string) string) (class, reason string, err error) {
	class, reason = get("class"), get("reason")
	if q := get("reason_q"); q != "" {
		if reason, err = strconv.Unquote(q); err != nil {
			return "", "", httpError{http.StatusBadRequest, "the form's reason_q is not a quoted string: reload the confirmation page"}
		}
	}
	if err := groupFilter(class, reason).Validate(); err != nil {
		return "", "", httpError{http.StatusBadRequest, err.Error()}
	}
	return class, reason, nil
}

func (s *Server) confirmRequeueGroup(_ http.ResponseWriter, r *http.Request) (string, any, error) {
	if s.cfg.ReadOnly {
		return "", nil, httpError{http.StatusForbidden, "read-only console: actions are disabled"}
	}
	class, reason, err := groupParams(r.URL.Query().Get)
	if err != nil {
		return "", nil, err
	}
	c, err := s.countRequeue(r.Context(), groupFilter(class, reason))
	if err != nil {
		return "", nil, err
	}
	return "confirm_group", confirmGroupData{Class: class, Reason: reason, Rows: c.Rows}, nil
}

func (s *Server) requeueGroup(w http.ResponseWriter, r *http.Request) {
	class, reason, err := groupParams(r.PostFormValue)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	desc := fmt.Sprintf("console: FAILED rows failure_class=%s reason=%s", class, strconv.Quote(reason))
	n, err := s.requeue(r.Context(), operatorOf(r), groupFilter(class, reason), desc)
	rows := plural.Noun(n, "row", "rows")
	switch {
	case err != nil && n == 0:
		s.fail(w, r, err)
	case err != nil:
		// Requeue commits batch by batch: what it did stays done, and the
		// page says so rather than an error that hides it.
		_, why := s.publicError(err)
		http.Redirect(w, r, "/failed?"+s.flashQuery(fmt.Sprintf(
			"Requeued %d %s (%s), then stopped: %s The rest of the group is still FAILED: requeue it again.", n, rows, desc, why)), http.StatusSeeOther)
	default:
		http.Redirect(w, r, "/failed?"+s.flashQuery(fmt.Sprintf("Requeued %d %s (%s).", n, rows, desc)), http.StatusSeeOther)
	}
}

// pauseDelivery pauses delivery on every instance (the overview's form:
// until, a time or a duration, empty for until resumed; reason), recorded
// in forward_operator_log as `outbox pause` is.
func (s *Server) pauseDelivery(w http.ResponseWriter, r *http.Request) {
	until, err := outboxdb.ParsePauseEnd(r.PostFormValue("until"), time.Now())
	if err != nil {
		s.fail(w, r, httpError{http.StatusBadRequest, "console: " + err.Error()})
		return
	}
	op, reason := operatorOf(r), r.PostFormValue("reason")
	_, err = outboxdb.PauseDelivery(r.Context(), s.pool, until, op, reason)
	s.log.Info("console pause", "operator", op, "until", until, "reason", reason, "error", err)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	done := "Delivery paused until resumed: no instance sends a request; messages are still persisted."
	if !until.IsZero() {
		done = "Delivery paused until " + until.UTC().Format(time.RFC3339) + ": no instance sends a request; messages are still persisted."
	}
	http.Redirect(w, r, "/?"+s.flashQuery(done), http.StatusSeeOther)
}

// resumeDelivery ends the pause now, recorded as `outbox resume` is.
func (s *Server) resumeDelivery(w http.ResponseWriter, r *http.Request) {
	op := operatorOf(r)
	was, err := outboxdb.ResumeDelivery(r.Context(), s.pool, op)
	s.log.Info("console resume", "operator", op, "was_paused", was, "error", err)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	done := "Delivery resumed: every instance sends again within a second, ramping up."
	if !was {
		done = "Nothing to resume: delivery was not paused."
	}
	http.Redirect(w, r, "/?"+s.flashQuery(done), http.StatusSeeOther)
}
