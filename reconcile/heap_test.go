package reconcile_test

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// heapGrowth runs run with frequent collections (so that the live heap is
// read often) and returns the live heap before it, by how much it grew at
// most while run ran, and how long run took.
func heapGrowth(run func()) (before uint64, grew int64, took time.Duration) {
	defer debug.SetGCPercent(debug.SetGCPercent(10))
	runtime.GC()
	before = liveHeap()
	stop, peak := make(chan struct{}), make(chan uint64)
	go func() {
		var most uint64
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				peak <- most
				return
			case <-tick.C:
				most = max(most, liveHeap())
			}
		}
	}()
	began := time.Now()
	run()
	close(stop)
	return before, int64(<-peak) - int64(before), time.Since(began)
}

// liveHeap is the heap the last collection found reachable.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
