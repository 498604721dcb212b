// Package systest is the daemon-level suite: whole daemons, run in the
// test's own process (internal/daemon/daemontest), against real
// redis-server and nats-server processes, for the behaviours that only
// the assembled daemon shows (a fleet sharing shards, a server outage, a
// failover, the wire protocol end to end). Each behaviour a package's
// unit tests already hold is left to them; what needs the built binary
// (the CLI, exit codes, signals, kill -9, memory limits) is in
// cmd/delayd's tests. It holds no code but its tests.
package systest
