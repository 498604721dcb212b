package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// RedisCPU is the CPU time, in seconds, that Redis' main thread (the one
// that runs every command and script) has used since it started, summed
// over every master under Cluster. It is the whole server's, whoever its
// clients are: `delayd bench` reads it around its phases on a Redis of its
// own, to give Redis' share of a schedule and of a delivery. A server that
// does not report its main thread (before Redis 7.0) gives its total.
func RedisCPU(ctx context.Context, rdb redis.UniversalClient) (float64, error) {
	var mu sync.Mutex
	var sum float64
	read := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "cpu").Result()
		if err != nil {
			return err
		}
		s, err := mainThreadCPU(info)
		if err != nil {
			return err
		}
		mu.Lock()
		sum += s
		mu.Unlock()
		return nil
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, read)
	case *redis.Client:
		err = read(ctx, c)
	default:
		err = fmt.Errorf("store: cannot read the CPU of a %T", rdb)
	}
	if err != nil {
		return 0, fmt.Errorf("store: Redis CPU: %w", err)
	}
	return sum, nil
}

// mainThreadCPU reads INFO cpu: used_cpu_{user,sys}_main_thread, or
// used_cpu_{user,sys} where those are missing.
func mainThreadCPU(info string) (float64, error) {
	fields := map[string]float64{}
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			fields[k] = f
		}
	}
	if u, ok := fields["used_cpu_user_main_thread"]; ok {
		return u + fields["used_cpu_sys_main_thread"], nil
	}
	u, ok := fields["used_cpu_user"]
	if !ok {
		return 0, fmt.Errorf("no used_cpu_user in INFO cpu")
	}
	return u + fields["used_cpu_sys"], nil
}
