package outboxdb

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// ExplainAnalyzeAttempts runs the statements that ShowRecord and Find use to
// read attempt logs (lookup_attempts.sql for the row id, lookup_errcodes.sql
// for the rows ids) under EXPLAIN (ANALYZE, FORMAT JSON), for the plan tests.
func ExplainAnalyzeAttempts(ctx context.Context, db TxBeginner, id int64, createdAt time.Time,
	ids []int64, created []time.Time) (attempts, errcodes string, err error) {
	err = ReadOnly(ctx, db, LookupOptions{}, func(tx pgx.Tx) error {
		const explain = "EXPLAIN (ANALYZE, FORMAT JSON) "
		if err := tx.QueryRow(ctx, explain+attemptsSQL, id, DefaultAttemptLimit, createdAt).Scan(&attempts); err != nil {
			return err
		}
		return tx.QueryRow(ctx, explain+errcodesSQL, ids, created).Scan(&errcodes)
	})
	return attempts, errcodes, err
}

// ExplainAnalyzeFind is ExplainFind run: EXPLAIN (ANALYZE, FORMAT JSON)
// of Find(f), which tells the partitions that the search read.
func ExplainAnalyzeFind(ctx context.Context, db TxBeginner, f FindFilter) (string, error) {
	if err := f.Validate(); err != nil {
		return "", err
	}
	var plan string
	err := ReadOnly(ctx, db, LookupOptions{}, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+findSQL[findDriver(f).name], f.args()).Scan(&plan)
	})
	return plan, err
}

// ExplainRates is the plan of ReadRates, as EXPLAIN (FORMAT JSON) prints it.
func ExplainRates(ctx context.Context, db TxBeginner) (string, error) {
	return explain(ctx, db, LookupOptions{}, consoleRatesSQL, RateCap)
}

// ReadRatesCapped is ReadRates reading at most limit rows a side.
func ReadRatesCapped(ctx context.Context, q Querier, limit int) (Rates, error) {
	return readRates(ctx, q, limit)
}

// ExplainHolder is the plan of the statement ShowRecord reads a held row's
// holder with (lookup_holder.sql), as EXPLAIN (FORMAT JSON) prints it.
func ExplainHolder(ctx context.Context, db TxBeginner, orderingKey string, id int64) (string, error) {
	return explain(ctx, db, LookupOptions{}, holderSQL, orderingKey, id)
}
