package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// clockTicks is the unit of the CPU times in /proc/<pid>/stat (USER_HZ),
// 100 on every Linux this runs on.
const clockTicks = 100

// procTimes are one process's CPU times in seconds, from /proc/<pid>/stat.
type procTimes struct {
	PPID int
	// User and System are the process's own; ChildUser and ChildSystem
	// those of its children it has waited for.
	User, System, ChildUser, ChildSystem float64
}

func (t procTimes) own() float64 { return t.User + t.System }
func (t procTimes) all() float64 { return t.User + t.System + t.ChildUser + t.ChildSystem }

func readProcTimes(pid int) (procTimes, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procTimes{}, err
	}
	// The command name is in parentheses and may hold spaces: the fields
	// that matter come after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procTimes{}, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return procTimes{}, fmt.Errorf("parsing /proc/%d/stat: %d fields", pid, len(f))
	}
	num := func(s string) float64 { v, _ := strconv.ParseFloat(s, 64); return v / clockTicks }
	ppid, _ := strconv.Atoi(f[1])
	return procTimes{PPID: ppid, User: num(f[11]), System: num(f[12]), ChildUser: num(f[13]), ChildSystem: num(f[14])}, nil
}

// statusKB reads a "Key:   123 kB" line of /proc/<pid>/status (or any file
// of that format, such as smaps_rollup) in bytes.
func statusKB(path, key string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, key+":"); ok {
			fields := strings.Fields(rest)
			if len(fields) == 0 {
				break
			}
			v, err := strconv.ParseInt(fields[0], 10, 64)
			return v * 1024, err
		}
	}
	return 0, fmt.Errorf("%s: no %s", path, key)
}

// childrenOf lists the live processes whose parent is pid.
func childrenOf(pid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if t, err := readProcTimes(p); err == nil && t.PPID == pid {
			out = append(out, p)
		}
	}
	return out
}

// treeSample is the CPU time and memory of a process and its children.
type treeSample struct {
	// CPU counts the root's time, its reaped children's and its live
	// children's (with theirs), so the difference of two samples is the
	// CPU the tree used in between, backends that exited included.
	CPU float64
	// PSS is the proportional set size of the tree: shared memory (the
	// shared buffers of PostgreSQL) is counted once, not once per process.
	PSS int64
	// RSS is the plain sum of the resident sets (shared pages counted in
	// each process).
	RSS int64
}

func sampleTree(root int) (treeSample, error) {
	rt, err := readProcTimes(root)
	if err != nil {
		return treeSample{}, err
	}
	s := treeSample{CPU: rt.all()}
	pids := append([]int{root}, childrenOf(root)...)
	for i, p := range pids {
		if i > 0 {
			if t, err := readProcTimes(p); err == nil {
				s.CPU += t.all()
			}
		}
		if v, err := statusKB(fmt.Sprintf("/proc/%d/smaps_rollup", p), "Pss"); err == nil {
			s.PSS += v
		}
		if v, err := statusKB(fmt.Sprintf("/proc/%d/status", p), "VmRSS"); err == nil {
			s.RSS += v
		}
	}
	return s, nil
}

// postmasterPID reads the server's pid from its data directory.
func postmasterPID(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("reading the postmaster's pid: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(line))
}

// usage is what one process (tree) used during a measurement.
type usage struct {
	// CPU is in seconds.
	CPU float64
	// PeakRSS is the consumer's peak resident set (VmHWM) or PostgreSQL's
	// peak PSS, in bytes.
	PeakRSS int64
}

// meter follows a consumer process and the PostgreSQL tree during one
// measurement: CPU as the difference of the samples at start and stop (the
// consumer's from its start); memory as the consumer's high-water mark
// (VmHWM, exact) and the peak of PostgreSQL's PSS sampled once a second.
type meter struct {
	postmaster int
	consumer   int
	pgStart    float64
	selfStart  float64
	consStart  float64
	busyStart  float64

	mu         sync.Mutex
	pgPeakPSS  int64
	stopSample chan struct{}
	sampled    chan struct{}
}

// startMeter takes the first samples of PostgreSQL and of this process;
// attach then names the consumer.
func startMeter(postmaster int) (*meter, error) {
	m := &meter{postmaster: postmaster, stopSample: make(chan struct{}), sampled: make(chan struct{})}
	pg, err := sampleTree(postmaster)
	if err != nil {
		return nil, fmt.Errorf("sampling PostgreSQL: %w", err)
	}
	m.pgStart, m.pgPeakPSS = pg.CPU, pg.PSS
	m.selfStart = selfCPU()
	m.busyStart = machineBusy()
	return m, nil
}

// attach starts following the consumer. fromStart counts its CPU since the
// process started; otherwise since now.
func (m *meter) attach(pid int, fromStart bool) {
	m.consumer = pid
	if !fromStart {
		if t, err := readProcTimes(pid); err == nil {
			m.consStart = t.own()
		}
	}
	go m.sample()
}

func (m *meter) sample() {
	defer close(m.sampled)
	// Reading smaps_rollup walks a process's page tables: once a second
	// keeps the bench's own CPU out of the way. The consumer's peak needs
	// no sampling: the kernel keeps its high-water mark (VmHWM).
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-m.stopSample:
			return
		case <-t.C:
		}
		if pg, err := sampleTree(m.postmaster); err == nil {
			m.mu.Lock()
			m.pgPeakPSS = max(m.pgPeakPSS, pg.PSS)
			m.mu.Unlock()
		}
	}
}

// stop ends the measurement; call it while the consumer still runs. self
// is the CPU of this process (the broker and the mock platform), others the
// CPU that every other process of the machine used meanwhile.
func (m *meter) stop() (consumer, pg usage, self, others float64) {
	close(m.stopSample)
	<-m.sampled
	if t, err := readProcTimes(m.consumer); err == nil {
		consumer.CPU = t.own() - m.consStart
	}
	if v, err := statusKB(fmt.Sprintf("/proc/%d/status", m.consumer), "VmHWM"); err == nil {
		consumer.PeakRSS = v
	}
	if s, err := sampleTree(m.postmaster); err == nil {
		pg.CPU = s.CPU - m.pgStart
		m.pgPeakPSS = max(m.pgPeakPSS, s.PSS)
	}
	m.mu.Lock()
	pg.PeakRSS = m.pgPeakPSS
	m.mu.Unlock()
	self = selfCPU() - m.selfStart
	others = max(0, machineBusy()-m.busyStart-consumer.CPU-pg.CPU-self)
	return consumer, pg, self, others
}

// machineBusy is the CPU time, in seconds, the machine's CPUs have spent
// running processes since boot (/proc/stat: user, nice, system, steal).
// Interrupt and softirq time are left out: the loopback traffic of the
// measured processes is handled there and is charged to no process.
func machineBusy() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0
	}
	var busy float64
	for i, v := range f[1:] {
		// user nice system idle iowait irq softirq steal guest ...
		if i == 3 || i == 4 || i == 5 || i == 6 || i >= 8 {
			continue
		}
		n, _ := strconv.ParseFloat(v, 64)
		busy += n
	}
	return busy / clockTicks
}

// selfCPU is this process's CPU time: the broker and the mock platform.
func selfCPU() float64 {
	t, err := readProcTimes(os.Getpid())
	if err != nil {
		return 0
	}
	return t.own()
}

// loadAvg is the 1-minute load average.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// waitForLoad polls the load average until it drops below limit, for at
// most maxWait: the figures mean little on a machine busy with other work.
func waitForLoad(ctx context.Context, limit float64, maxWait time.Duration) {
	deadline := time.Now().Add(maxWait)
	for {
		l := loadAvg()
		if l < limit {
			logf("load average %.2f is below %.2f: measuring", l, limit)
			return
		}
		if time.Now().After(deadline) {
			logf("load average still %.2f after %s: measuring anyway", l, maxWait)
			return
		}
		logf("load average %.2f (want < %.2f): waiting", l, limit)
		select {
		case <-ctx.Done():
			return
		case <-time.After(30 * time.Second):
		}
	}
}

// describeMachine names the CPU, cores, memory, kernel and versions.
func describeMachine(pgVersion string) string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	mem, _ := statusKB("/proc/meminfo", "MemTotal")
	kernel := "?"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("%s, %d cores, %.0f GiB RAM, Linux %s (%s), %s, PostgreSQL %s",
		model, runtime.NumCPU(), float64(mem)/(1<<30), kernel, describeWriteback(), runtime.Version(), pgVersion)
}

// describeWriteback gives the kernel's page-cache writeback settings, on
// which the latency tail depends (docs/benchmarks.md, "The latency tail is
// a writeback burst").
func describeWriteback() string {
	var parts []string
	for _, name := range []string{"dirty_expire_centisecs", "dirty_writeback_centisecs", "dirty_background_bytes", "dirty_background_ratio"} {
		b, err := os.ReadFile("/proc/sys/vm/" + name)
		if err != nil {
			continue
		}
		parts = append(parts, "vm."+name+"="+strings.TrimSpace(string(b)))
	}
	return strings.Join(parts, " ")
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64) + " ms"
}
