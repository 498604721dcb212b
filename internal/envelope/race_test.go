//go:build race

package envelope

// Under -race sync.Pool drops items at random: allocation counts vary.
func init() { raceEnabled = true }
