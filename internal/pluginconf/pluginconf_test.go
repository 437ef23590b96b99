package pluginconf

import (
	"errors"
	"strconv"
	"testing"
)

func TestField(t *testing.T) {
	t.Parallel()
	fields := map[string]string{"batch_size": "300", "lease": "x", "limit": "7"}
	var reads []string
	readInt := func(path ...string) (int, error) {
		reads = append(reads, path[0])
		return strconv.Atoi(fields[path[0]])
	}

	var err error
	batch := Field(&err, readInt, "batch_size")
	lease := Field(&err, readInt, "lease")
	limit := Field(&err, readInt, "limit")

	if batch != 300 {
		t.Errorf("batch_size = %d, want 300", batch)
	}
	var numErr *strconv.NumError
	if !errors.As(err, &numErr) || numErr.Num != "x" {
		t.Errorf("err = %v, want the failed read of lease", err)
	}
	if lease != 0 || limit != 0 {
		t.Errorf("lease, limit = %d, %d: want zero values after the failed read", lease, limit)
	}
	if len(reads) != 2 {
		t.Errorf("read %v: want nothing read after the first error", reads)
	}
}
