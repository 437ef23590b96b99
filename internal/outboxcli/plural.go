package outboxcli

import "strconv"

// plural is n with the noun for it: "1 row", "0 rows", "2 rows".
func plural[N int | int64](n N, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.FormatInt(int64(n), 10) + " " + many
}
