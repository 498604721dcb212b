package main

import (
	"math"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/hashicorp/go-hclog"
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
