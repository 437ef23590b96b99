//go:build !linux

package main

func takeForeground() (restore func()) { return func() {} }
