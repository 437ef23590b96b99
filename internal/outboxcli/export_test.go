package outboxcli

// CheckDatabase is the start-up check of one outbox database
// (CheckSchemaOnStart) for DATABASE_URL dsn.
func CheckDatabase(dsn string) error {
	return checkDatabase(database{dsn: dsn, dsnName: "DATABASE_URL", directName: "DATABASE_DIRECT_URL"})
}
