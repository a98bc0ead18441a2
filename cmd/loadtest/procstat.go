package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// procStat is what /proc says of a process at one instant (Linux).
type procStat struct {
	rss, hwm int64         // VmRSS and VmHWM (the peak RSS since it started), bytes
	cpu      time.Duration // user + system time since it started
}

// userHZ is the unit of /proc/<pid>/stat's times: USER_HZ, 100 on every Linux ABI Go
// runs on.
const userHZ = 100

// readProcStat reads pid's /proc/<pid>/status and /proc/<pid>/stat.
func readProcStat(pid int) (procStat, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procStat{}, err
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(status, stat)
}

// parseProcStat reads VmRSS and VmHWM (in kB) from a status file, and utime and stime
// (fields 14 and 15, in USER_HZ ticks) from a stat file.
func parseProcStat(status, stat []byte) (procStat, error) {
	var p procStat
	for line := range bytes.Lines(status) {
		for _, f := range []struct {
			key string
			dst *int64
		}{{"VmRSS:", &p.rss}, {"VmHWM:", &p.hwm}} {
			rest, ok := bytes.CutPrefix(line, []byte(f.key))
			if !ok {
				continue
			}
			fields := bytes.Fields(rest)
			if len(fields) != 2 || string(fields[1]) != "kB" {
				return procStat{}, fmt.Errorf("/proc status: unexpected %q", bytes.TrimSpace(line))
			}
			kb, err := strconv.ParseInt(string(fields[0]), 10, 64)
			if err != nil {
				return procStat{}, fmt.Errorf("/proc status: %w", err)
			}
			*f.dst = kb << 10
		}
	}
	if p.rss == 0 || p.hwm == 0 {
		return procStat{}, fmt.Errorf("/proc status: no VmRSS or VmHWM")
	}
	// The command name, in parentheses, may hold spaces: fields count from the last ")".
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("/proc stat: no command name")
	}
	fields := bytes.Fields(stat[i+1:]) // fields[0] is field 3, the state
	if len(fields) < 13 {
		return procStat{}, fmt.Errorf("/proc stat: %d fields after the name, want at least 13", len(fields))
	}
	var ticks int64
	for _, f := range fields[11:13] { // utime, stime
		n, err := strconv.ParseInt(string(f), 10, 64)
		if err != nil {
			return procStat{}, fmt.Errorf("/proc stat: %w", err)
		}
		ticks += n
	}
	p.cpu = time.Duration(ticks) * time.Second / userHZ
	return p, nil
}

// procSampler reads kvroute's /proc every interval: its peak RSS (VmHWM, which the
// kernel keeps, and the highest VmRSS seen after the warm-up) and its CPU time at the
// warm-up's end and the load's.
type procSampler struct {
	pid   int
	every time.Duration
	// read reads a process's /proc; nil is readProcStat (tests give their readings).
	read func(pid int) (procStat, error)

	mu      sync.Mutex
	err     error
	last    procStat
	warm    bool
	warmCPU time.Duration
	maxRSS  int64 // after the warm-up
	// peak is the highest VmHWM or VmRSS any reading gave: the kernel updates VmHWM
	// lazily (at unmaps and exits), so a peak between two of those can be gone from a
	// later VmHWM while a sample caught it in VmRSS.
	peak     int64
	endCPU   time.Duration
	measured bool // end was called after markWarm
}

func (p *procSampler) loop(ctx context.Context) {
	t := time.NewTicker(p.every)
	defer t.Stop()
	for {
		p.take()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// take reads /proc once; an error (the process gone) is kept and the last good
// reading stands.
func (p *procSampler) take() procStat {
	read := p.read
	if read == nil {
		read = readProcStat
	}
	s, err := read(p.pid)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		if p.err == nil {
			p.err = err
		}
		return p.last
	}
	p.last = s
	p.peak = max(p.peak, s.hwm, s.rss)
	if p.warm {
		p.maxRSS = max(p.maxRSS, s.rss)
	}
	return s
}

// markWarm starts the measurement.
func (p *procSampler) markWarm() {
	s := p.take()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.warm, p.warmCPU, p.maxRSS = true, s.cpu, s.rss
}

// end closes the measurement (the load's end, before the drain).
func (p *procSampler) end() {
	s := p.take()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endCPU, p.measured = s.cpu, p.warm
}

// procReport is kvroute's process as /proc saw it.
type procReport struct {
	PeakRSS        int64   `json:"vm_hwm_bytes"`            // the peak since it started: the highest VmHWM or VmRSS read
	MaxRSSMeasured int64   `json:"max_vm_rss_bytes"`        // highest VmRSS sampled after the warm-up
	CPUMeasured    float64 `json:"cpu_seconds_measured"`    // from the warm-up's end to the load's
	CPUTotal       float64 `json:"cpu_seconds_at_the_end"`  // since it started, after the drain
	Every          float64 `json:"sample_interval_seconds"` // the sampling interval
	Err            string  `json:"error,omitempty"`
}

// report reads /proc a last time (after the drain) and summarises.
func (p *procSampler) report() procReport {
	s := p.take()
	p.mu.Lock()
	defer p.mu.Unlock()
	r := procReport{PeakRSS: p.peak, MaxRSSMeasured: p.maxRSS, CPUTotal: s.cpu.Seconds(), Every: p.every.Seconds()}
	if p.measured {
		r.CPUMeasured = (p.endCPU - p.warmCPU).Seconds()
	}
	if p.err != nil {
		r.Err = p.err.Error()
	}
	return r
}
