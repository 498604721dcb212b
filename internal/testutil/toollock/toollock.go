//go:build unix

// Package toollock lets the tests and ./test.sh share the pinned tools of
// the cache dir: whoever builds one holds dir+".lock" (flock(2), as
// flock(1) takes it in test.sh) until the binary is in place, and the
// others wait for it there instead of building it a second time.
package toollock

import (
	"os"
	"syscall"
)

// Lock blocks until it holds the lock of the tool dir dir, and returns
// its release. A lock that cannot be taken (a read-only cache) is no
// lock: the caller builds or finds the tool as before.
func Lock(dir string) (unlock func()) {
	f, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return func() {}
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return func() {}
	}
	return func() { f.Close() } // closing releases the lock
}
