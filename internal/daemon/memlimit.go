package daemon

import (
	"math"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/hashicorp/go-hclog"

	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/scanner"
)

// setMemoryLimit sets the Go runtime's soft memory limit to 90% of the
// cgroup's memory limit (a container's limits.memory, systemd's MemoryMax),
// so the GC works harder before the kernel's OOM killer steps in. An
// explicit GOMEMLIMIT (or AUTOMEMLIMIT=off) wins. Only the daemon does
// this: client commands are short-lived.
func setMemoryLimit(log hclog.Logger) {
	limit, err := memlimit.Set(memlimit.WithProvider(memlimit.FromCgroup))
	switch {
	case err != nil:
		log.Debug("no memory limit from the cgroup", "error", err)
	case limit > 0 && limit < math.MaxInt64:
		log.Info("Go memory limit set from the cgroup", "GOMEMLIMIT", limit)
	default:
		log.Debug("the cgroup sets no memory limit; GOMEMLIMIT left unset")
	}
}

// intakeBytes is intake.pending_bytes, derived from the Go memory limit
// when it is 0 (derivedIntakeBytes).
func intakeBytes(c config.Config) int64 {
	if c.Intake.PendingBytes > 0 {
		return c.Intake.PendingBytes
	}
	return derivedIntakeBytes()
}

// streamBytes is intake.stream.pull_bytes, derived like intake.pending_bytes
// when it is 0.
func streamBytes(c config.Config) int64 {
	if c.Intake.Stream.PullBytes > 0 {
		return c.Intake.Stream.PullBytes
	}
	return derivedIntakeBytes()
}

// derivedIntakeBytes is a sixteenth of the Go memory limit (at least 1 MiB,
// at most 32 MiB), or 32 MiB without one.
func derivedIntakeBytes() int64 {
	limit := debug.SetMemoryLimit(-1)
	if limit <= 0 || limit == math.MaxInt64 {
		return 32 << 20
	}
	return max(min(32<<20, limit/16), 1<<20)
}

// claimBytes is scanner.claim_bytes, derived from the Go memory limit
// (set just before, from the cgroup or GOMEMLIMIT) when it is 0.
func claimBytes(c config.Config, log hclog.Logger) int64 {
	if c.Scanner.ClaimBytes > 0 {
		return c.Scanner.ClaimBytes
	}
	n := scanner.AutoClaimBytes()
	log.Info("claim byte budget derived", "scanner.claim_bytes", n, "held at most", 4*n)
	return n
}
