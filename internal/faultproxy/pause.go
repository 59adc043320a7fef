package faultproxy

import (
	"fmt"
	"syscall"
)

// Pause stops process pid (SIGSTOP) as a stalled host would: it keeps its
// connections and its state but does nothing until Resume.
func Pause(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pause process %d: %w", pid, err)
	}
	return nil
}

// Resume continues a paused process (SIGCONT).
func Resume(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		return fmt.Errorf("resume process %d: %w", pid, err)
	}
	return nil
}
