package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// intakeKey is the HASH of the intake streams' floors: stream name →
// "<creation time ns>/<floor>". One field per stream name, a few bytes;
// the creation time tells a stream deleted and made again (which starts
// its sequences at 1) from the one the floor was saved for.
func intakeKey(ns string) string { return membersKey(ns) + ":intake" }

// SaveIntakeFloor records that every message of the intake stream name
// (created at createdNs) up to sequence floor is settled. A lower floor
// than the one saved changes nothing.
func (s *Store) SaveIntakeFloor(ctx context.Context, name string, createdNs int64, floor uint64) error {
	if floor == 0 {
		return nil
	}
	err := exec1(ctx, s, intakeFloorOp, intakeFloorArgs{key: intakeKey(s.ns), stream: name, createdNs: createdNs,
		floor: floor}).err
	if err != nil {
		return fmt.Errorf("store: save intake floor of %s: %w", name, err)
	}
	return nil
}

// IntakeFloor is the floor saved for the intake stream name created at
// createdNs: 0 when none was saved, or only for another stream of that
// name.
func (s *Store) IntakeFloor(ctx context.Context, name string, createdNs int64) (uint64, error) {
	v, err := s.rdb.HGet(ctx, intakeKey(s.ns), name).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("store: read intake floor of %s: %w", name, err)
	}
	created, floor, ok := strings.Cut(v, "/")
	if !ok || created != strconv.FormatInt(createdNs, 10) {
		return 0, nil
	}
	f, err := strconv.ParseUint(floor, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("store: intake floor of %s: %q is not a sequence", name, v)
	}
	return f, nil
}
