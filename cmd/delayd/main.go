// Command delayd is a sidecar daemon that gives NATS publishers reliable
// delayed delivery, backed by a sharded Redis sorted set.
package main

import (
	"context"
	"os"
)

func main() {
	os.Exit(exitCode(run(context.Background(), os.Args, os.Getenv, os.Stdout, os.Stderr), os.Stderr))
}
