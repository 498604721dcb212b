//go:build race

package clienttest

func init() { testFlags = append(testFlags, "-race") }
