package outboxdb

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Bounds of the lookups.
const (
	// DefaultLookupTimeout is the statement timeout of a lookup when the
	// caller gives none: an operator waits seconds, not minutes, and a
	// forgotten query cannot hold a connection of a busy database.
	DefaultLookupTimeout = 5 * time.Second
	// DefaultFindLimit is how many rows a search returns when not told.
	DefaultFindLimit = 50
	// MaxFindLimit is the most rows one search returns.
	MaxFindLimit = 1000
	// DefaultAttemptLimit is how many attempt logs (the latest) a record
	// lookup returns.
	DefaultAttemptLimit = 500
)

// FindFilter selects rows for Find. Empty fields do not filter; the
// conditions that are given combine with AND.
type FindFilter struct {
	Plate, Park, Berth, Device string
	// Status is one of PENDING, IN_PROGRESS, SUCCESS, FAILED.
	Status Status
	// Errcode keeps rows whose latest attempt log (LEASE_EXPIRED and REQUEUED
	// aside) has this platform_errcode.
	Errcode string
	// Since and Until bound created_at: Since <= created_at < Until.
	Since, Until time.Time
	// Limit caps the rows returned: DefaultFindLimit when 0, at most
	// MaxFindLimit.
	Limit int
}

// Validate checks the filter's values.
func (f FindFilter) Validate() error {
	if err := cmp.Or(CheckText("plate", f.Plate), CheckText("park", f.Park), CheckText("berth", f.Berth),
		CheckText("device", f.Device), CheckText("errcode", f.Errcode)); err != nil {
		return err
	}
	switch f.Status {
	case "", StatusPending, StatusInProgress, StatusSuccess, StatusFailed:
	default:
		return fmt.Errorf("status %q: want PENDING, IN_PROGRESS, SUCCESS or FAILED", f.Status)
	}
	if f.Limit < 0 || f.Limit > MaxFindLimit {
		return fmt.Errorf("limit %d: want 1 to %d", f.Limit, MaxFindLimit)
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return fmt.Errorf("since %s is not before until %s", f.Since.Format(time.RFC3339), f.Until.Format(time.RFC3339))
	}
	return nil
}

// CheckText refuses values that cannot be compared with a text column: a
// NUL byte, or bytes that are not UTF-8. No stored value holds either, and
// PostgreSQL answers such a parameter with an error, not with no rows. The
// error names the first such value.
func CheckText(name string, values ...string) error {
	for _, v := range values {
		if strings.IndexByte(v, 0) >= 0 || !utf8.ValidString(v) {
			return fmt.Errorf("%s %q: not text (a NUL byte, or bytes that are not UTF-8): no row holds it", name, v)
		}
	}
	return nil
}

// String describes the filter for people (an audit row, a heading).
func (f FindFilter) String() string {
	var parts []string
	add := func(name, v string) {
		if v != "" {
			parts = append(parts, name+"="+strconv.Quote(v))
		}
	}
	add("plate", f.Plate)
	add("park", f.Park)
	add("berth", f.Berth)
	add("device", f.Device)
	add("status", string(f.Status))
	add("errcode", f.Errcode)
	if !f.Since.IsZero() {
		add("since", f.Since.UTC().Format(time.RFC3339))
	}
	if !f.Until.IsZero() {
		add("until", f.Until.UTC().Format(time.RFC3339))
	}
	if len(parts) == 0 {
		return "(all rows)"
	}
	return strings.Join(parts, " ")
}

// driver is the part of a search that reaches the rows: the index it walks,
// in that index's order, so the walk stops after the limit (lookup_find.sql).
type driver struct {
	name string
	// rows is the statement that finds the rows' ids and partitions.
	rows string
	// result orders the rows found (forward_records r) as rows did.
	result string
}

// messagesDriver walks an index of forward_messages
// (lookup_find_messages.sql): where is its condition, order the column
// order of the index.
func messagesDriver(name, where, order string) driver {
	s := strings.Replace(findMessagesSQL, "/*DRIVER*/", where, 1)
	return driver{name, strings.Replace(s, "/*ORDER*/", order, 1), "r.id DESC"}
}

// The drivers, most selective first; findDriver picks the first whose
// filters are given. The lookup indexes are on every partition of
// forward_messages and forward_retry_logs: a driver that walks one reads
// each partition's index in its order and merges them, so it starts with
// one probe per partition that the time filters leave in.
var (
	// forward_messages_plate_idx (plate_no, id).
	driverPlate = messagesDriver("plate",
		"m.plate_no >= @plate::text AND m.plate_no <= @plate::text",
		"m.plate_no DESC, m.id DESC")
	// forward_messages_park_idx (park_code, berth_code, id).
	driverParkBerth = messagesDriver("park_berth",
		"m.park_code >= @park::text AND m.park_code <= @park::text AND m.berth_code >= @berth::text AND m.berth_code <= @berth::text",
		"m.park_code DESC, m.berth_code DESC, m.id DESC")
	// forward_messages_device_idx (device_id, id).
	driverDevice = messagesDriver("device",
		"m.device_id >= @device::text AND m.device_id <= @device::text",
		"m.device_id DESC, m.id DESC")
	// forward_messages_berth_idx (berth_code, id).
	driverBerth = messagesDriver("berth",
		"m.berth_code >= @berth::text AND m.berth_code <= @berth::text",
		"m.berth_code DESC, m.id DESC")
	// forward_messages_park_id_idx (park_code, id).
	driverPark = messagesDriver("park",
		"m.park_code >= @park::text AND m.park_code <= @park::text",
		"m.park_code DESC, m.id DESC")
	// forward_retry_logs_errcode_idx (platform_errcode, record_id).
	driverErrcode = driver{"errcode", findErrcodeSQL, "r.id DESC"}
	// forward_deliveries_status_idx (status, updated_at).
	driverStatus = driver{"status", findStatusSQL, "r.updated_at DESC, r.id DESC"}
	// The primary key (id, created_at) of the partitions, newest id first:
	// no filter, only SUCCESS (the bulk, where the newest rows match at
	// once), or only a time range, which leaves out the partitions outside
	// it and is checked on the key's entries (created_at is in the key), so
	// a walk reads past at most one partition's entries outside the range.
	driverAll = messagesDriver("all", "true", "m.id DESC")
)

func findDriver(f FindFilter) driver {
	switch {
	case f.Plate != "":
		return driverPlate
	case f.Park != "" && f.Berth != "":
		return driverParkBerth
	case f.Device != "":
		return driverDevice
	case f.Berth != "":
		return driverBerth
	case f.Park != "":
		return driverPark
	case f.Errcode != "":
		return driverErrcode
	case f.Status != "" && f.Status != StatusSuccess:
		return driverStatus
	default:
		return driverAll
	}
}

// findSQL is the search statement of each driver, built once.
var findSQL = func() map[string]string {
	m := map[string]string{}
	for _, d := range []driver{driverPlate, driverParkBerth, driverDevice, driverBerth, driverPark,
		driverErrcode, driverStatus, driverAll} {
		s := strings.Replace(findTemplateSQL, "/*ROWS*/", d.rows, 1)
		m[d.name] = strings.Replace(s, "/*RESULT ORDER*/", d.result, 1)
	}
	return m
}()

// args are the filter's values by the names the statements use; a
// statement reads those it needs.
func (f FindFilter) args() pgx.NamedArgs {
	text := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	at := func(t time.Time) any {
		if t.IsZero() {
			return nil
		}
		return t
	}
	limit := f.Limit
	if limit == 0 {
		limit = DefaultFindLimit
	}
	return pgx.NamedArgs{
		"plate": text(f.Plate), "park": text(f.Park), "berth": text(f.Berth), "device": text(f.Device),
		"status": text(string(f.Status)), "errcode": text(f.Errcode),
		"since": at(f.Since), "until": at(f.Until), "limit": limit,
	}
}

// FoundRow is one row of a search: of its Record, only the columns
// lookup_find.sql reads are set.
type FoundRow struct {
	Record
	// LastErrcode is the platform errcode of the latest attempt, nil when
	// there is none (no attempt, or a reply without errcode).
	LastErrcode *string `db:"-" json:"last_errcode"`
}

// LookupOptions bound one lookup.
type LookupOptions struct {
	// Timeout is the statement timeout (DefaultLookupTimeout when 0).
	Timeout time.Duration
}

// ReadOnly runs fn in a read-only transaction with the lookups' settings:
// the statement timeout of opts, a plan made for the actual values of every
// statement (plan_cache_mode = force_custom_plan, which the searches rely on
// to drop the filters that are not given), and neither JIT nor parallel
// workers, which would cost an interactive query more than they save and
// take CPU from the dispatchers. The console uses it for its own queries.
func ReadOnly(ctx context.Context, db TxBeginner, opts LookupOptions, fn func(tx pgx.Tx) error) error {
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = DefaultLookupTimeout
	}
	return pgx.BeginTxFunc(ctx, db, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('statement_timeout', $1, true),
				set_config('plan_cache_mode', 'force_custom_plan', true),
				set_config('jit', 'off', true),
				set_config('max_parallel_workers_per_gather', '0', true)`,
			strconv.FormatInt(timeout.Milliseconds(), 10)); err != nil {
			return fmt.Errorf("setting up the lookup: %w", err)
		}
		return fn(tx)
	})
}

// Find returns the rows matching f, newest first: by id, or by updated_at
// when only a status other than SUCCESS narrows the search (the order of
// the index each search walks; a time range alone walks the primary key).
func Find(ctx context.Context, db TxBeginner, f FindFilter, opts LookupOptions) ([]FoundRow, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	var found []FoundRow
	err := ReadOnly(ctx, db, opts, func(tx pgx.Tx) error {
		d := findDriver(f)
		rows, err := tx.Query(ctx, findSQL[d.name], f.args())
		if err != nil {
			return err
		}
		found, err = pgx.CollectRows(rows, pgx.RowToStructByNameLax[FoundRow])
		if err != nil || len(found) == 0 {
			return err
		}
		ids := make([]int64, len(found))
		created := make([]time.Time, len(found))
		at := make(map[int64]int, len(found))
		for i, r := range found {
			ids[i], created[i] = r.ID, r.CreatedAt
			at[r.ID] = i
		}
		rows, err = tx.Query(ctx, errcodesSQL, ids, created)
		if err != nil {
			return err
		}
		var id int64
		var code *string
		_, err = pgx.ForEachRow(rows, []any{&id, &code}, func() error {
			found[at[id]].LastErrcode = code
			return nil
		})
		return err
	})
	if err != nil {
		// Not the filter: a plate is personal data, and errors get logged.
		return nil, fmt.Errorf("searching rows: %w", err)
	}
	return found, nil
}

// ExplainFind returns the plan PostgreSQL uses for Find(f), as EXPLAIN
// (FORMAT JSON) prints it, planned in the same settings: for operators who
// want to see which index a search walks on their database, and for the
// plan tests.
func ExplainFind(ctx context.Context, db TxBeginner, f FindFilter, opts LookupOptions) (string, error) {
	if err := f.Validate(); err != nil {
		return "", err
	}
	d := findDriver(f)
	return explain(ctx, db, opts, findSQL[d.name], f.args())
}

// ExplainShow is ExplainFind for ShowRecord(ref).
func ExplainShow(ctx context.Context, db TxBeginner, ref string, opts LookupOptions) (string, error) {
	return explain(ctx, db, opts, showSQL, showArgs(ref)...)
}

func explain(ctx context.Context, db TxBeginner, opts LookupOptions, sql string, args ...any) (string, error) {
	var plan string
	err := ReadOnly(ctx, db, opts, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&plan)
	})
	return plan, err
}

// Attempt is one forward_retry_logs row; its JSON is `outbox show --json`'s.
type Attempt struct {
	ID              int64      `db:"id" json:"-"`
	AttemptedAt     time.Time  `db:"attempted_at" json:"attempted_at"`
	AttemptNumber   int        `db:"attempt_number" json:"attempt_number"`
	ResultStatus    string     `db:"result_status" json:"result_status"`
	HTTPStatus      *int32     `db:"http_status" json:"http_status"`
	PlatformErrcode *string    `db:"platform_errcode" json:"platform_errcode"`
	DurationMS      *int32     `db:"duration_ms" json:"duration_ms"`
	NextRetryAt     *time.Time `db:"next_retry_at" json:"next_retry_at"`
	ErrorMessage    *string    `db:"error_message" json:"error_message"`
}

type attemptRow struct {
	Attempt
	Total int64 `db:"total"`
}

// RecordView is what ShowRecord found.
type RecordView struct {
	Record
	// Attempts are the latest attempt logs (at most DefaultAttemptLimit),
	// oldest first; AttemptsTotal counts them all.
	Attempts      []Attempt
	AttemptsTotal int64
	// OtherID is set when the reference was a number that is both this
	// row's message_key and another row's id: that other row's id.
	OtherID *int64
	// HeldBehind is, for a row held by ordering, the row it waits behind;
	// nil otherwise, and for a held row whose key nothing holds at the
	// moment (the dispatcher releases it).
	HeldBehind *Holder
	// Platform is, for a row not yet finished, the shared platform state
	// (an open breaker or a pause holds every such row); nil otherwise.
	Platform *PlatformState
}

// Holder is the row a held row waits behind: its key's head, due, waiting
// for a retry or in flight, or the FAILED row blocking its key
// (ORDER_ON_FAILED=block).
type Holder struct {
	ID           int64      `db:"id" json:"id"`
	MessageKey   string     `db:"message_key" json:"message_key"`
	Status       Status     `db:"status" json:"status"`
	AttemptCount int        `db:"attempt_count" json:"attempt_count"`
	NextRetryAt  *time.Time `db:"next_retry_at" json:"next_retry_at"`
	LastError    *string    `db:"last_error" json:"last_error"`
	Blocking     bool       `db:"order_blocked" json:"order_blocked"`
	// HeldBefore counts the rows of the key held before the shown one:
	// they go after the holder, one at a time, before it.
	HeldBefore int64 `db:"held_before" json:"held_before"`
}

// ErrNoRecord is returned by ShowRecord when no row matches.
var ErrNoRecord = errors.New("no such row")

func showArgs(ref string) []any {
	var id any
	if n, err := strconv.ParseInt(ref, 10, 64); err == nil {
		id = n
	}
	return []any{ref, id}
}

// ShowRecord reads the row whose message_key is ref, or, when ref is a
// number and no key matches, whose id is ref, with its attempt log.
func ShowRecord(ctx context.Context, db TxBeginner, ref string, opts LookupOptions) (RecordView, error) {
	v, err := showRecord(ctx, db, opts, showArgs(ref))
	if err != nil {
		if errors.Is(err, ErrNoRecord) {
			return v, fmt.Errorf("%w with message_key or id %q", ErrNoRecord, ref)
		}
		return v, fmt.Errorf("reading row %q: %w", ref, err)
	}
	return v, nil
}

// ShowRecordByID is ShowRecord by id only.
func ShowRecordByID(ctx context.Context, db TxBeginner, id int64, opts LookupOptions) (RecordView, error) {
	v, err := showRecord(ctx, db, opts, []any{nil, id})
	if err != nil {
		if errors.Is(err, ErrNoRecord) {
			return v, fmt.Errorf("%w with id %d", ErrNoRecord, id)
		}
		return v, fmt.Errorf("reading row %d: %w", id, err)
	}
	return v, nil
}

func showRecord(ctx context.Context, db TxBeginner, opts LookupOptions, args []any) (RecordView, error) {
	var v RecordView
	err := ReadOnly(ctx, db, opts, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, showSQL, args...)
		if err != nil {
			return err
		}
		recs, err := pgx.CollectRows(rows, pgx.RowToStructByNameLax[Record])
		if err != nil {
			return err
		}
		if len(recs) == 0 {
			return ErrNoRecord
		}
		v.Record = recs[0]
		if len(recs) > 1 {
			v.OtherID = &recs[1].ID
		}
		rows, err = tx.Query(ctx, attemptsSQL, v.ID, DefaultAttemptLimit, v.CreatedAt)
		if err != nil {
			return err
		}
		logs, err := pgx.CollectRows(rows, pgx.RowToStructByName[attemptRow])
		if err != nil {
			return err
		}
		v.Attempts = make([]Attempt, len(logs))
		for i, l := range logs {
			v.Attempts[i] = l.Attempt
			v.AttemptsTotal = l.Total
		}
		if v.Status != StatusPending && v.Status != StatusInProgress {
			return nil
		}
		p, err := ReadPlatformState(ctx, tx)
		if err != nil {
			return err
		}
		v.Platform = &p
		if !v.OrderHeld || v.OrderingKey == nil {
			return nil
		}
		rows, err = tx.Query(ctx, holderSQL, *v.OrderingKey, v.ID)
		if err != nil {
			return err
		}
		holders, err := pgx.CollectRows(rows, pgx.RowToStructByName[Holder])
		if err != nil {
			return err
		}
		if len(holders) > 0 {
			v.HeldBehind = &holders[0]
		}
		return nil
	})
	return v, err
}
