// Package plural spells counts in what the operator commands, the console,
// the service's status lines and the dev stack print: "1 row", "2 rows".
package plural

import "strconv"

// Count is n with the noun for it: "1 row", "0 rows", "2 rows".
func Count[N ~int | ~int64](n N, one, many string) string {
	return strconv.FormatInt(int64(n), 10) + " " + Noun(n, one, many)
}

// Noun is the noun for n things: one for 1, many for any other count.
func Noun[N ~int | ~int64](n N, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
