package outboxcli

// CheckDatabase is the start-up check of one outbox database
// (CheckSchemaOnStart) for DATABASE_URL dsn.
func CheckDatabase(dsn string) error {
	return checkDatabase(database{dsn: dsn, dsnName: "DATABASE_URL", directName: "DATABASE_DIRECT_URL"})
}

// CheckDatabaseDirect is CheckDatabase for a DATABASE_URL dsn that leads to
// a pooler, with DATABASE_DIRECT_URL direct.
func CheckDatabaseDirect(dsn, direct string) error {
	return checkDatabase(database{dsn: dsn, direct: direct, dsnName: "DATABASE_URL", directName: "DATABASE_DIRECT_URL"})
}
