package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
)

// component is one long-running part of the daemon.
type component struct {
	name string
	run  func(ctx context.Context) error
}

// runOrdered runs every component until ctx is done or one of them returns
// (a failure: the first to fail stops the rest), then stops them one at a
// time, in order, all within the deadline.
func runOrdered(ctx context.Context, comps []component, deadline time.Duration, log hclog.Logger) error {
	stops := make([]context.CancelFunc, len(comps))
	dones := make([]chan error, len(comps))
	failed := make(chan int, len(comps))
	for i, c := range comps {
		cctx, cancel := context.WithCancel(context.Background())
		stops[i], dones[i] = cancel, make(chan error, 1)
		go func() {
			err := c.run(cctx)
			dones[i] <- err
			failed <- i
		}()
	}
	var runErr error
	select {
	case <-ctx.Done():
	case i := <-failed:
		runErr = <-dones[i]
		dones[i] <- runErr
		log.Error("component stopped unexpectedly, shutting down", "component", comps[i].name, "error", runErr)
		runErr = fmt.Errorf("%s: %w", comps[i].name, orStopped(runErr))
	}
	log.Info("shutting down", "deadline", deadline)
	timeout := time.After(deadline)
	for i, c := range comps {
		stops[i]()
		select {
		case err := <-dones[i]:
			if err != nil && !errors.Is(runErr, err) {
				runErr = errors.Join(runErr, fmt.Errorf("%s: %w", c.name, err))
			}
		case <-timeout:
			return fmt.Errorf("shutdown deadline %s exceeded while stopping %s; unacknowledged envelopes will be redelivered after their lease", deadline, c.name)
		}
	}
	return runErr
}

func orStopped(err error) error {
	if err == nil {
		return errors.New("stopped")
	}
	return err
}
