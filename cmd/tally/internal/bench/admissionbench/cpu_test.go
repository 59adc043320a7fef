package admissionbench

import (
	"testing"
	"time"
)

func TestMachineCPUReadsProcStat(t *testing.T) {
	busy0, cores, ok := machineCPU()
	if !ok || cores < 1 || busy0 <= 0 {
		t.Fatalf("machineCPU() = %s, %d cores, %v; want busy time and cores above 0", busy0, cores, ok)
	}
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); { // spin: busy time must grow
	}
	if busy1, _, _ := machineCPU(); busy1 <= busy0 {
		t.Fatalf("busy time did not grow over 300 ms of spinning: %s then %s", busy0, busy1)
	}
}
