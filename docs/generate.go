// Package docs holds the repository's documentation. Its Go files only
// generate docs/reference (go generate ./docs) and check that the pages
// agree with the code (docs_test.go).
package docs

//go:generate go run ../internal/docgen -out reference -src ..
