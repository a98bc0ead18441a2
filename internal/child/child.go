// Package child runs kvroute's binaries as child processes for the demo and the load
// test: start one, wait for the line that says it is ready, stop it with SIGTERM.
package child

import (
	"bufio"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is a running child. Its stdout and stderr are drained (and dropped once the
// ready line has been seen) so it never blocks on a full pipe.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}

	mu   sync.Mutex
	tail []string // the last tailLines lines of output
}

// tailLines is how many of the last output lines Tail keeps.
const tailLines = 20

// Start starts bin with args and waits up to a minute (a loaded machine, a race build)
// for a line on its stdout or stderr containing want, which it returns.
func Start(bin string, args []string, want string) (*Process, string, error) {
	cmd := exec.Command(bin, args...)
	stdout, _ := cmd.StdoutPipe()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("start %s: %w (run `make build` first)", bin, err)
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	lines := make(chan string, 16)
	var wg sync.WaitGroup
	for _, r := range []io.Reader{stdout, stderr} {
		wg.Go(func() {
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				p.keep(sc.Text())
				select {
				case lines <- sc.Text():
				default:
				}
			}
			_, _ = io.Copy(io.Discard, r) // a line over 1 MiB: keep draining
		})
	}
	go func() { wg.Wait(); _ = cmd.Wait(); close(p.done) }()
	timeout := time.After(time.Minute)
	for {
		select {
		case l := <-lines:
			if strings.Contains(l, want) {
				return p, l, nil
			}
		case <-p.done:
			return nil, "", fmt.Errorf("%s exited before it was ready", filepath.Base(bin))
		case <-timeout:
			p.Stop()
			return nil, "", fmt.Errorf("%s not ready after a minute", filepath.Base(bin))
		}
	}
}

func (p *Process) keep(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.tail) == tailLines {
		p.tail = append(p.tail[:0], p.tail[1:]...)
	}
	p.tail = append(p.tail, line)
}

// Tail returns the child's last lines of output (stdout and stderr interleaved), to
// explain a failure.
func (p *Process) Tail() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.tail...)
}

// Pid is the child's process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Stop sends SIGTERM and waits for the child to exit, killing it after 5 s.
func (p *Process) Stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Exited reports whether the child has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}
