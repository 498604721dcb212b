//go:build race

package main

// The test binary is built with -race: timings stretch.
func init() { raceEnabled = true }
