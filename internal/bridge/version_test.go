package bridge

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/delayd/delayd/internal/testutil"
)

// TestServiceVersion: every version a build can carry maps to one NATS
// micro accepts (checked by micro itself, on a real server), and a
// version that already is SemVer is kept as it is, less its "v".
func TestServiceVersion(t *testing.T) {
	t.Parallel()
	n := testutil.StartNATS(t)
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for _, c := range []struct{ in, want string }{
		{"v0.2.0", "0.2.0"},
		{"0.1.0-dev", "0.1.0-dev"},
		{"v1.2.3-rc.1+build.5", "1.2.3-rc.1+build.5"},
		{"v0.0.0-20261201171517-a451f2be0959", "0.0.0-20261201171517-a451f2be0959"},
		{"v0.0.0-20261201171517-a451f2be0959+dirty", "0.0.0-20261201171517-a451f2be0959+dirty"},
		{"v0.2.1-0.20261201171517-a451f2be0959", "0.2.1-0.20261201171517-a451f2be0959"},
		{"(devel)", "0.0.0-dev+devel"},
		{"", "0.0.0-dev"},
		{"v1.2", "0.0.0-dev+v1.2"},
		{"1.2.3-01", "0.0.0-dev+1.2.3-01"},
		{"my build #7 (patched)", "0.0.0-dev+my.build.7.patched"},
		{"..+..", "0.0.0-dev"},
	} {
		got := ServiceVersion(c.in)
		if got != c.want {
			t.Errorf("ServiceVersion(%q) = %q, want %q", c.in, got, c.want)
		}
		svc, err := micro.AddService(nc, micro.Config{Name: "versioncheck", Version: got})
		if err != nil {
			t.Errorf("micro refuses ServiceVersion(%q) = %q: %v", c.in, got, err)
			continue
		}
		_ = svc.Stop()
	}
}
