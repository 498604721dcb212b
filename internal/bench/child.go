package bench

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ChildOptions describe the delayd the bench starts with --local or
// --embedded, and measures.
type ChildOptions struct {
	// Binary is the delayd to run as "Binary run" (the bench's own
	// executable).
	Binary string
	// Embedded runs the child with --embedded (its own in-process NATS
	// server at the bench's NATS URL, and a Redis emulation); otherwise it
	// uses RedisAddrs.
	Embedded   bool
	RedisAddrs []string
	// Inherit are the bench's own --config and --set, given to the child
	// first, so that it reads the config the bench does (its Redis above
	// all: DropNamespace deletes the child's keys through it).
	Inherit []string
	// Set are --child-set KEY=VALUE settings, given last (after the
	// bench's own settings, which they may not touch: CheckChildSet).
	Set []string
	// CPUProfile, if set, is where the child writes a CPU profile.
	CPUProfile string
	// Stderr receives the child's log.
	Stderr io.Writer
	// DropNamespace deletes the keys of the child's Redis namespace ns. The
	// bench calls it once the child is gone (not with Embedded: the
	// emulation goes with the child). Redis is the store's business, so
	// the caller wires it.
	DropNamespace func(ctx context.Context, ns string) error
	// RedisCPU, if set, reads the CPU seconds Redis' main thread has used
	// (store.RedisCPU); the bench reads it around its intake and its
	// deliveries (not with Embedded).
	RedisCPU func(ctx context.Context) (float64, error)
}

// CheckChildSet refuses --child-set settings that are not KEY=VALUE, and
// those of the keys the bench sets itself (ownsKey).
func CheckChildSet(kvs []string) error {
	for _, kv := range kvs {
		key, _, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("--child-set %q: want KEY=VALUE", kv)
		}
		if ownsKey(key) {
			return fmt.Errorf("--child-set %s: the bench sets it itself, so that its child is the only delayd it talks to and loads (use the bench's own flags or --set for the servers: the child inherits them)", key)
		}
	}
	return nil
}

// ownsKey reports whether the bench sets config key itself for its
// child: the keys that keep the child apart from any other delayd (its
// subject prefix, namespace and stream) and point it at the bench's
// servers (set them with the bench's --set: the child inherits it). A
// --child-set of one of them could make the bench load, and then clean up,
// a real deployment.
func ownsKey(key string) bool {
	key = strings.ToLower(strings.TrimSpace(key))
	switch key {
	case "subject", "namespace", "intake.stream.enabled", "intake.stream.name", "nats.url", "embedded":
		return true
	}
	// How to reach Redis: the bench deletes the child's keys afterwards
	// through its own settings, which the child shares (--set for both).
	switch {
	case key == "redis.addrs", key == "redis.db", key == "redis.cluster", key == "redis.master_name",
		key == "redis.username", key == "redis.password", strings.HasPrefix(key, "redis.tls"):
		return true
	}
	return false
}

// identity is what keeps a child apart from any other delayd on the same
// servers: a subject prefix, a Redis namespace and an intake stream of its
// own, so whatever else runs there can neither answer the bench nor be
// loaded (or cleaned up) by it.
type identity struct {
	subject, namespace, stream string
}

func newIdentity() identity {
	own := strconv.FormatInt(time.Now().UnixNano(), 36)
	return identity{subject: "bench" + own, namespace: "bench-" + own, stream: "BENCH_" + strings.ToUpper(own)}
}

// child is the delayd the bench started, watched so that a child that
// exits early (its port taken, a bad setting) stops the bench at once.
type child struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // once exited is closed
}

// childArgs are the arguments of "delayd run" for a child with identity
// id on natsURL: the bench's own --config and --set first, then its
// settings as --set, which win over both, then --child-set and
// --child-cpuprofile (ownsKey keeps those off the bench's settings).
func childArgs(o ChildOptions, natsURL string, id identity, stream bool) []string {
	args := append([]string{"run"}, o.Inherit...)
	args = append(args, "--nats-url", natsURL, "--log-level", "warn", "--set", "http.addr=127.0.0.1:0", "--set", "ui.enabled=false",
		"--set", "subject="+id.subject, "--set", "namespace="+id.namespace,
		"--set", "intake.stream.enabled="+strconv.FormatBool(stream), "--set", "intake.stream.name="+id.stream)
	if o.Embedded {
		args = append(args, "--embedded")
	} else if len(o.RedisAddrs) > 0 {
		args = append(args, "--redis-addrs", strings.Join(o.RedisAddrs, ","))
	}
	for _, kv := range o.Set {
		args = append(args, "--set", kv)
	}
	if o.CPUProfile != "" {
		args = append(args, "--cpuprofile", o.CPUProfile)
	}
	return args
}

// startChild runs the child, whose CPU time and peak RSS stop reads when
// it exits.
func startChild(o ChildOptions, natsURL string, id identity, stream bool) (*child, error) {
	cmd := exec.Command(o.Binary, childArgs(o, natsURL, id, stream)...)
	cmd.Stderr = o.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start delayd: %w", err)
	}
	ch := &child{cmd: cmd, exited: make(chan struct{})}
	go func() {
		ch.err = cmd.Wait()
		close(ch.exited)
	}()
	return ch, nil
}

// kill ends the child at once, if it is still running, and waits for it.
func (ch *child) kill() {
	_ = ch.cmd.Process.Kill()
	<-ch.exited
}

// stop ends the child gracefully and returns what it used.
func (ch *child) stop() (*Usage, error) {
	_ = ch.cmd.Process.Signal(syscall.SIGTERM)
	<-ch.exited
	if err := ch.err; err != nil {
		return nil, fmt.Errorf("delayd child: %w", err)
	}
	ru, ok := ch.cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		return nil, nil
	}
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return &Usage{CPUSeconds: cpu.Seconds(), PeakRSSMiB: float64(ru.Maxrss) / 1024}, nil
}

// exitedEarly says, once the child has exited, that it did.
func (ch *child) exitedEarly() error {
	select {
	case <-ch.exited:
		return fmt.Errorf("the delayd child exited before it answered (%v): nothing was sent; "+
			"is its NATS port already in use (another server, another delayd)?", ch.err)
	default:
		return nil
	}
}
