package systest

import (
	"flag"
	"os"
	"runtime"
	"strconv"
	"testing"
)

// TestMain runs more tests at once than go test's default of one per CPU:
// the whole-daemon tests spend their time waiting (for timers to fall due,
// leases to expire, servers to come back), each on its own redis-server and
// nats-server, so a 2-core machine runs several side by side. An explicit
// -parallel still wins (.ci/run's soak step gives -parallel 1).
func TestMain(m *testing.M) {
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		_ = flag.Set("test.parallel", strconv.Itoa(max(6, 3*runtime.GOMAXPROCS(0))))
	}
	os.Exit(m.Run())
}
