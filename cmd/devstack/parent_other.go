//go:build !linux

package main

// stopWithParent does nothing where the parent's death cannot be signalled.
func stopWithParent() {}

// keepStoppingOnSIGTERM does nothing where stopWithParent does nothing.
func keepStoppingOnSIGTERM() {}
