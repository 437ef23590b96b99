package outboxdb

// SkipOrderLocks leaves the ordering key locks out until the returned
// function is called, for the tests that show what the locks prevent. Tests
// using it must not run in parallel with others.
func SkipOrderLocks() (restore func()) {
	skipOrderLocks = true
	return func() { skipOrderLocks = false }
}

// PlatformReadSQL is the gate's read of the shared platform state.
func PlatformReadSQL() string { return platformReadSQL }

// StatementSQL is the statement of file name in sql/ as the package runs
// it: with the fragments it includes.
func StatementSQL(name string) string { return mustSQL(name) }
