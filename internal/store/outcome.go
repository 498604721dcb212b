package store

import (
	"errors"
	"net"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// ErrOutcomeUnknown marks a failed write that may still have happened: the
// command was sent, and no answer came (a timeout, a connection cut after
// the write). Callers must not say "nothing stored" then.
var ErrOutcomeUnknown = errors.New("outcome unknown")

// ErrNotWritten marks a failed write that certainly changed nothing: no
// connection could be made, or Redis refused the command before running it.
var ErrNotWritten = errors.New("nothing written")

// refusals are Redis error prefixes for commands refused before they ran.
// WRONGTYPE comes from a script's first read of a key of the wrong type,
// which comes before any write (lua/prelude.lua).
var refusals = []string{"OOM", "LOADING", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "NOSCRIPT",
	"BUSY", "NOAUTH", "WRONGPASS", "NOPERM", "MOVED", "ASK", "WRONGTYPE", "NOREPLICAS", "MISCONF"}

// classify wraps err with ErrNotWritten or ErrOutcomeUnknown. Only what is
// certainly unwritten is said to be: a refused dial, an exhausted pool, a
// refusal from Redis. Anything else may have reached Redis.
func classify(err error, cluster bool) error {
	if err == nil || errors.Is(err, ErrNotWritten) || errors.Is(err, ErrOutcomeUnknown) {
		return err
	}
	if notWritten(err, cluster) {
		return errors.Join(ErrNotWritten, err)
	}
	return errors.Join(ErrOutcomeUnknown, err)
}

func notWritten(err error, cluster bool) bool {
	var re redis.Error
	if asRedisError(err, &re) {
		for _, p := range refusals {
			if redis.HasErrorPrefix(err, p) {
				return true
			}
		}
		if missingFunction(err) || unknownFCall(err) {
			return true
		}
		return false
	}
	if cluster {
		// The Cluster client retries a failed node on another attempt
		// (MaxRedirects): an earlier attempt may have written even when the
		// last one could not dial.
		return false
	}
	if errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrClosed) || errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

func asRedisError(err error, re *redis.Error) bool {
	// An error reply, including one a script raised, is a redis.Error;
	// redis.Nil is one too, and means no error here.
	return err != nil && !errors.Is(err, redis.Nil) && errors.As(err, re)
}
