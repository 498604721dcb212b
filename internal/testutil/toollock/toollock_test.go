package toollock

import (
	"os"
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

// Dir is DELAYD_TOOLS_DIR when set (./test.sh sets it to where it
// installs), else delayd-tools in the user's cache dir.
func TestDir(t *testing.T) {
	t.Setenv("DELAYD_TOOLS_DIR", "")
	cache, err := os.UserCacheDir()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and no user cache dir: %v", err)
		}
		t.Skip(err)
	}
	if got := Dir(); got != filepath.Join(cache, "delayd-tools") {
		t.Errorf("Dir() = %q without DELAYD_TOOLS_DIR, want %q", got, filepath.Join(cache, "delayd-tools"))
	}
	t.Setenv("DELAYD_TOOLS_DIR", "/tmp/cold-tools")
	if got := Dir(); got != "/tmp/cold-tools" {
		t.Errorf("Dir() = %q, want DELAYD_TOOLS_DIR's /tmp/cold-tools", got)
	}
}
