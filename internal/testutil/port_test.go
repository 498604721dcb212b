package testutil

import (
	"net"
	"os"
	"strconv"
	"testing"
)

// A port from FreePort is never one the kernel hands out on its own (to
// another process's :0 listener, or as the local port of an outgoing
// connection, of which the tests make hundreds): TestTwoDaemonsDeliverOnce
// once failed "admin: listen 127.0.0.1:34931 ... address already in use"
// under go test ./..., a port taken in the meantime.
func TestFreePortOutsideTheEphemeralRange(t *testing.T) {
	lo, hi, ok := ephemeralRange()
	if !ok {
		if os.Getenv("CI") == "true" {
			t.Fatal("no /proc/sys/net/ipv4/ip_local_port_range (CI=true)")
		}
		t.Skip("no /proc/sys/net/ipv4/ip_local_port_range")
	}
	seen := map[int]bool{}
	for range 200 {
		p := FreePort(t)
		if p >= lo && p <= hi {
			t.Fatalf("FreePort gave %d, inside the kernel's ephemeral range %d-%d", p, lo, hi)
		}
		if seen[p] {
			t.Fatalf("FreePort gave %d twice", p)
		}
		seen[p] = true
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("FreePort gave %d, which cannot be bound: %v", p, err)
		}
		l.Close()
	}
}
