package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// A CPU split says where a run's CPU went: per envelope, per process
// (Redis' main thread, the delayd child, nats-server, the bench itself).
// On a machine that is CPU-bound it shows which process saturates first,
// and what a machine with more cores would give (docs/BENCHMARKS.md);
// the throughput alone cannot, as every process shares the cores.

// Process names in a split.
const (
	ProcRedis  = "redis"
	ProcDelayd = "delayd"
	ProcNATS   = "nats"
	ProcBench  = "bench"
)

// CPUSplit is CPU µs per envelope (or baseline message) for each process
// that could be read, over a run's intake and over its deliveries.
type CPUSplit struct {
	Intake   map[string]float64 `json:"intake,omitempty"`
	Delivery map[string]float64 `json:"delivery,omitempty"`
}

// cpuSource reads the CPU seconds one process has used so far.
type cpuSource struct {
	name string
	read func(context.Context) (float64, error)
}

// meter reads its sources together; one that fails is dropped for the
// rest of the bench, so a split never mixes readings of different spans.
type meter struct {
	sources []cpuSource
}

// newMeter meters the bench itself, and each source given (a nil read is
// skipped). A nil *meter reads nothing.
func newMeter(sources ...cpuSource) *meter {
	m := &meter{}
	if _, err := procCPU(os.Getpid())(context.Background()); err == nil {
		m.sources = append(m.sources, cpuSource{ProcBench, procCPU(os.Getpid())})
	}
	for _, s := range sources {
		if s.read != nil {
			m.sources = append(m.sources, s)
		}
	}
	return m
}

// only is a meter of m's sources of these names: a run that does not
// touch the others (JetStream schedules: no delayd, no Redis) is not
// charged with what they did meanwhile.
func (m *meter) only(names ...string) *meter {
	if m == nil {
		return nil
	}
	out := &meter{}
	for _, s := range m.sources {
		if slices.Contains(names, s.name) {
			out.sources = append(out.sources, s)
		}
	}
	return out
}

// take reads every source.
func (m *meter) take(ctx context.Context) map[string]float64 {
	out := map[string]float64{}
	if m == nil {
		return out
	}
	kept := m.sources[:0]
	for _, s := range m.sources {
		v, err := s.read(ctx)
		if err != nil {
			continue
		}
		out[s.name] = v
		kept = append(kept, s)
	}
	m.sources = kept
	return out
}

// perUnit is the CPU µs per unit between readings a and b, for the
// processes read both times; nil when there is nothing to divide.
func perUnit(a, b map[string]float64, units int) map[string]float64 {
	if units <= 0 {
		return nil
	}
	out := map[string]float64{}
	for name, v := range b {
		if was, ok := a[name]; ok && v >= was {
			out[name] = (v - was) * 1e6 / float64(units)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// procCPU reads process pid's user and system CPU seconds from
// /proc/<pid>/stat (Linux; elsewhere it fails, and the process is left
// out of the split).
func procCPU(pid int) func(context.Context) (float64, error) {
	path := "/proc/" + strconv.Itoa(pid) + "/stat"
	return func(context.Context) (float64, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0, err
		}
		return parseProcStat(string(b))
	}
}

// CheckPid says why process pid's CPU cannot be read, if it cannot, and
// its command name (/proc/<pid>/comm), so a caller can tell a pid that is
// not what it was meant to be.
func CheckPid(pid int) (string, error) {
	if pid <= 0 {
		return "", fmt.Errorf("%d is not a process id", pid)
	}
	if _, err := procCPU(pid)(context.Background()); err != nil {
		return "", err
	}
	comm, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return strings.TrimSpace(string(comm)), err
}

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// parseProcStat reads utime + stime from a /proc/<pid>/stat line. The
// command name, in parentheses, may hold spaces: fields are counted from
// its closing parenthesis.
func parseProcStat(s string) (float64, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("proc stat: no command name in %q", s)
	}
	f := strings.Fields(s[i+1:])
	// After the name: state (field 3), ..., utime (14), stime (15).
	if len(f) < 13 {
		return 0, fmt.Errorf("proc stat: %d fields after the name", len(f))
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("proc stat: utime %q, stime %q", f[11], f[12])
	}
	return float64(u+st) / clockTicks, nil
}

// printSplit writes one line of a split: each process, then the sum.
func printSplit(w io.Writer, label string, split map[string]float64, unit string) {
	if len(split) == 0 {
		return
	}
	var names []string
	for n := range split {
		names = append(names, n)
	}
	order := []string{ProcRedis, ProcDelayd, ProcNATS, ProcBench}
	slices.SortFunc(names, func(a, b string) int { return slices.Index(order, a) - slices.Index(order, b) })
	var parts []string
	sum := 0.0
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %.1f", n, split[n]))
		sum += split[n]
	}
	fmt.Fprintf(w, "%-10s %s   sum %.1f CPU µs per %s\n", label, strings.Join(parts, "   "), sum, unit)
}
