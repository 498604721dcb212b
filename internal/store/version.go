package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// MinRedis is the oldest Redis delayd supports: its shard scripts are a
// Functions library (FUNCTION LOAD, FCALL: Redis 7.0), and it reads
// several settings in one CONFIG GET and gives its scripts flags (7.0
// too). Valkey reports itself as Redis 7.2 and later. The embedded
// emulation is not a server and has no guard: it runs the same Lua as
// scripts.
const MinRedis = "7.0"

// ErrRedisTooOld is CheckVersion's refusal.
var ErrRedisTooOld = errors.New("store: Redis is older than " + MinRedis + ", the oldest delayd supports")

// CheckVersion refuses a Redis older than MinRedis: by INFO's
// redis_version, or, where the ACL refuses INFO (docs/security.md), by
// whether it knows FUNCTION. A Redis that cannot be asked (unreachable, a
// timeout) is not refused here: the next check asks again.
func CheckVersion(ctx context.Context, c Conn) error {
	info, err := c.Info(ctx, "server").Result()
	if err == nil {
		v := infoField(info, "redis_version")
		if major, _, ok := majorMinor(v); ok && major < 7 {
			return fmt.Errorf("%w: it is %s; upgrade Redis (or use Valkey 7.2 or later)", ErrRedisTooOld, v)
		}
		return nil
	}
	if !refused(err) {
		return nil
	}
	cmd := redis.NewCmd(ctx, "FUNCTION", "LIST", "LIBRARYNAME", "delayd_version_probe")
	if err := c.Process(ctx, cmd); err != nil && strings.Contains(strings.ToLower(err.Error()), "unknown command") {
		return fmt.Errorf("%w: it does not know FUNCTION (Redis 7.0); upgrade Redis (or use Valkey 7.2 or later)", ErrRedisTooOld)
	}
	return nil
}

// majorMinor reads "7.0.15" as 7, 0.
func majorMinor(v string) (major, minor int, ok bool) {
	a, rest, _ := strings.Cut(v, ".")
	b, _, _ := strings.Cut(rest, ".")
	major, err1 := strconv.Atoi(a)
	minor, err2 := strconv.Atoi(b)
	return major, minor, err1 == nil && err2 == nil
}
