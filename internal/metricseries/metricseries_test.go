package metricseries

import (
	"reflect"
	"testing"
)

func TestProduct(t *testing.T) {
	got := Product([]string{"a", "b"}, []string{"x", "y"})
	want := [][]string{{"a", "x"}, {"a", "y"}, {"b", "x"}, {"b", "y"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Product = %v, want %v", got, want)
	}
	if got := Product(); !reflect.DeepEqual(got, [][]string{{}}) {
		t.Fatalf("Product() = %v, want one empty series", got)
	}
}
