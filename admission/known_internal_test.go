package admission

import "testing"

// A full known map drops half its keys, not all: each key dropped costs
// its budget (or holder) the slower path once more (an insert before the
// lock, or an exclusive lock), so emptying it past its bound made every
// busy budget pay that at once, each time the map refilled.
func TestKnownPastItsBoundKeepsHalf(t *testing.T) {
	var k known[int]
	for i := range maxKnown + 2 {
		k.add([]int{i}, func(int) int64 { return 1 })
	}
	if n := len(k.m); n < maxKnown/2 {
		t.Fatalf("%d keys known after %d, want at least %d", n, maxKnown+2, maxKnown/2)
	}
	if _, ok := k.get(maxKnown + 1); !ok {
		t.Fatal("the key just added was dropped")
	}
}
