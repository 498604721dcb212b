package testutil

import (
	"fmt"
	"os"
	"runtime"
	"testing"
)

// RunMain runs setup, then the package's tests, then setup's cleanups, and
// returns the exit code for os.Exit. It is for servers shared by every
// test and example of a package: examples have no *testing.T to start
// their own. setup gets a testing.TB whose Fatal, Skip and Cleanup behave
// as a test's: a setup that fails fails the package, one that skips
// (redis-server missing outside CI) skips all of it.
func RunMain(m *testing.M, setup func(t testing.TB)) int {
	t := &mainTB{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		setup(t)
	}()
	<-done
	defer t.cleanup()
	switch {
	case t.failed:
		fmt.Fprintln(os.Stderr, "FAIL: setting up the shared servers:", t.msg)
		return 1
	case t.skipped:
		fmt.Fprintln(os.Stderr, "SKIP: every test of the package:", t.msg)
		return 0
	}
	return m.Run()
}

// mainTB is the part of testing.TB the helpers of this package use, for
// RunMain's setup. Fatal and Skip end the setup goroutine, as in a test.
type mainTB struct {
	testing.TB // not set: any other method panics
	cleanups   []func()
	failed     bool
	skipped    bool
	msg        string
}

func (t *mainTB) Helper()                   {}
func (t *mainTB) Name() string              { return "TestMain" }
func (t *mainTB) Failed() bool              { return t.failed }
func (t *mainTB) Cleanup(f func())          { t.cleanups = append(t.cleanups, f) }
func (t *mainTB) Log(args ...any)           { fmt.Fprintln(os.Stderr, args...) }
func (t *mainTB) Logf(f string, a ...any)   { fmt.Fprintf(os.Stderr, f+"\n", a...) }
func (t *mainTB) Error(args ...any)         { t.failed, t.msg = true, fmt.Sprint(args...) }
func (t *mainTB) Errorf(f string, a ...any) { t.failed, t.msg = true, fmt.Sprintf(f, a...) }
func (t *mainTB) Fatal(args ...any)         { t.Error(args...); runtime.Goexit() }
func (t *mainTB) Fatalf(f string, a ...any) { t.Errorf(f, a...); runtime.Goexit() }
func (t *mainTB) Skip(args ...any)          { t.skipped, t.msg = true, fmt.Sprint(args...); runtime.Goexit() }
func (t *mainTB) Skipf(f string, a ...any) {
	t.skipped, t.msg = true, fmt.Sprintf(f, a...)
	runtime.Goexit()
}

func (t *mainTB) TempDir() string {
	dir, err := os.MkdirTemp("", "delayd-test-")
	if err != nil {
		t.Fatalf("temp dir: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func (t *mainTB) cleanup() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}
