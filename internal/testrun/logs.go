package testrun

import (
	"bytes"
	"sync"
	"testing"
)

// Buffer collects a component's log output: safe for the component's
// goroutines writing while the test reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Logs returns a Buffer for a server's log whose content t logs if it
// fails, so that a failure comes with what the server said.
func Logs(t testing.TB) *Buffer {
	b := &Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server log:\n%s", b.String())
		}
	})
	return b
}
