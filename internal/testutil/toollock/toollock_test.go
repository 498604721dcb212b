package toollock

import (
	"path/filepath"
	"testing"
)

// A second Lock of the same dir waits for the first one's release.
func TestLockWaitsForRelease(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tool-v1")
	unlock := Lock(dir)
	got := make(chan struct{})
	go func() {
		Lock(dir)()
		close(got)
	}()
	select {
	case <-got:
		t.Fatal("a second Lock got the lock while the first held it")
	default:
	}
	unlock()
	<-got
}
