//go:build !unix

package toollock

// Lock is a no-op where flock(2) is missing: test.sh builds in the
// foreground there.
func Lock(dir string) (unlock func()) { return func() {} }
