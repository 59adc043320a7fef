package faultproxy

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"time"
)

// Mode is what a Proxy does with traffic.
type Mode int

const (
	// Pass forwards bytes both ways (after Latency, if set).
	Pass Mode = iota
	// Blackhole accepts connections but forwards nothing either way, until
	// the mode changes (then the held bytes flow).
	Blackhole
	// Refuse resets every open connection and every new one at once.
	Refuse
)

func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Blackhole:
		return "blackhole"
	case Refuse:
		return "refuse"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Proxy forwards TCP connections from its address to a target.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	mode    Mode
	latency time.Duration
	changed chan struct{} // closed and replaced at every change
	conns   map[net.Conn]struct{}
	closed  bool
	wg      sync.WaitGroup
}

// Start listens on a free local port and forwards to target: host:port, or
// unix:/path of a Unix socket (a private Postgres listening on no TCP port).
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, changed: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's address (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Mode returns the current mode.
func (p *Proxy) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Pass forwards traffic again.
func (p *Proxy) Pass() { p.set(Pass) }

// Blackhole stops forwarding without closing anything.
func (p *Proxy) Blackhole() { p.set(Blackhole) }

// Reset resets every open connection and refuses new ones until Pass.
func (p *Proxy) Reset() { p.set(Refuse) }

// Latency delays every chunk of bytes by d in each direction (0: none).
func (p *Proxy) Latency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.signalLocked()
	p.mu.Unlock()
}

func (p *Proxy) set(m Mode) {
	p.mu.Lock()
	p.mode = m
	var reset []net.Conn
	if m == Refuse {
		for c := range p.conns {
			reset = append(reset, c)
		}
	}
	p.signalLocked()
	p.mu.Unlock()
	for _, c := range reset {
		abort(c)
	}
}

func (p *Proxy) signalLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// Close stops listening and closes every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.signalLocked()
	p.mu.Unlock()
	err := p.ln.Close()
	for _, c := range conns {
		abort(c)
	}
	p.wg.Wait()
	return err
}

// abort closes c with a TCP RST (linger 0), as a dead peer does.
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.closed || p.mode == Refuse {
			p.mu.Unlock()
			abort(c)
			continue
		}
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.mode == Refuse {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) forget(cs ...net.Conn) {
	p.mu.Lock()
	for _, c := range cs {
		delete(p.conns, c)
	}
	p.mu.Unlock()
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	network, addr := "tcp", p.target
	if path, ok := strings.CutPrefix(p.target, "unix:"); ok {
		network, addr = "unix", path
	}
	server, err := net.DialTimeout(network, addr, 5*time.Second)
	if err != nil || !p.track(server) {
		if server != nil {
			abort(server)
		}
		abort(client)
		p.forget(client)
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(server, client) }()
	go func() { defer wg.Done(); p.pipe(client, server) }()
	wg.Wait()
	p.forget(client, server)
}

// pipe copies src to dst, honouring the mode at every chunk; when either
// side fails, both are closed (reset). Reading and writing are apart, so a
// latency delays every chunk from when it was read, as a long link does,
// and does not cap the bytes in flight.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer abort(dst)
	defer abort(src)
	chunks := make(chan chunk, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range chunks {
			if !p.deliver(dst, c) {
				abort(src) // the reader stops too
				for range chunks {
				}
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			// A copy of what was read, as queued chunks outlive the buffer.
			chunks <- chunk{b: append([]byte(nil), buf[:n]...), read: time.Now()}
		}
		if err != nil {
			break // EOF or a failure: the other direction ends too
		}
	}
	close(chunks)
	<-done
}

// chunk is bytes read from one side, and when.
type chunk struct {
	b    []byte
	read time.Time
}

// deliver writes c to dst once the mode lets it, the latency after it was
// read; false when the connection must end.
func (p *Proxy) deliver(dst net.Conn, c chunk) bool {
	for {
		p.mu.Lock()
		mode, latency, changed, closed := p.mode, p.latency, p.changed, p.closed
		p.mu.Unlock()
		if closed || mode == Refuse {
			return false
		}
		if mode == Blackhole {
			<-changed
			continue
		}
		if wait := time.Until(c.read.Add(latency)); wait > 0 {
			select {
			case <-time.After(wait):
			case <-changed:
				continue
			}
		}
		_, err := dst.Write(c.b)
		return err == nil
	}
}
