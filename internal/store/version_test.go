package store

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/internal/testutil"
)

// versionConn answers INFO server with version (or refuses it, as the ACL
// of docs/security.md does) and FUNCTION as a Redis of that version would.
type versionConn struct {
	version    string
	infoNoPerm bool
}

func (c versionConn) Info(ctx context.Context, _ ...string) *redis.StringCmd {
	cmd := redis.NewStringCmd(ctx, "info", "server")
	if c.infoNoPerm {
		cmd.SetErr(redis.Error(noPerm("info")))
		return cmd
	}
	cmd.SetVal("# Server\r\nredis_version:" + c.version + "\r\nredis_mode:standalone\r\n")
	return cmd
}

func (c versionConn) Process(_ context.Context, cmd redis.Cmder) error {
	if strings.EqualFold(cmd.Name(), "function") && c.version < "7" {
		err := errors.New("ERR unknown command 'FUNCTION', with args beginning with: 'LIST'")
		cmd.SetErr(err)
		return err
	}
	return nil
}

type noPerm string

func (n noPerm) Error() string {
	return "NOPERM User delayd has no permissions to run the '" + string(n) + "' command"
}
func (noPerm) RedisError() {}

// delayd needs Redis 7.0 or later (Valkey 7.2 or later): its scripts are
// a Functions library. An older server is refused with a message naming
// its version and the oldest supported, whether INFO may be read or the
// ACL refuses it (then FUNCTION tells).
func TestOldRedisRefused(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		c   versionConn
		old bool
	}{
		{versionConn{version: "6.2.14"}, true},
		{versionConn{version: "5.0.7"}, true},
		{versionConn{version: "6.2.14", infoNoPerm: true}, true},
		{versionConn{version: "7.0.0"}, false},
		{versionConn{version: "7.0.15", infoNoPerm: true}, false},
		{versionConn{version: "7.2.4"}, false}, // Valkey 7.2 and 8 say so
		{versionConn{version: "10.1.0"}, false},
	} {
		err := CheckVersion(ctx, tc.c)
		switch {
		case tc.old && (err == nil || !strings.Contains(err.Error(), "7.0")):
			t.Errorf("%+v: %v, want refused naming 7.0", tc.c, err)
		case tc.old && !tc.c.infoNoPerm && !strings.Contains(err.Error(), tc.c.version):
			t.Errorf("%+v: %v, want its version named", tc.c, err)
		case !tc.old && err != nil:
			t.Errorf("%+v: %v, want accepted", tc.c, err)
		}
	}
	// The guard stops the daemon with it, on every new connection.
	g := NewGuard(GuardOptions{SkipHidden: true}, hclog.NewNullLogger())
	if err := g.Check(ctx, versionConn{version: "6.2.14"}); !errors.Is(err, ErrRedisTooOld) {
		t.Errorf("the guard on Redis 6.2: %v, want ErrRedisTooOld", err)
	}
	// The real server of the tests.
	r := testutil.StartRedis(t)
	if err := CheckVersion(ctx, r.Client()); err != nil {
		t.Fatalf("the test's redis-server: %v", err)
	}
}
