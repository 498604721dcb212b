package daemon

import (
	"os"
	"strings"
	"testing"
)

// A shard's owner names its host, so the console's shards table tells an
// operator where each shard is scanned.
func TestDaemonIDNamesTheHost(t *testing.T) {
	host, _ := os.Hostname()
	if id := daemonID("delayd"); !strings.HasPrefix(id, "delayd@"+host+"-") {
		t.Fatalf("daemon id %q does not name the host %q", id, host)
	}
}
