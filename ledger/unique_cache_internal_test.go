package ledger

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// TestMemberCacheStaysWithinItsBound: sets that grow past the bound are
// dropped, whole, until a quarter of the room is free; a set larger than
// the bound on its own is not kept; what is kept answers exactly.
func TestMemberCacheStaysWithinItsBound(t *testing.T) {
	c := newMemberCache(100)
	days := func(n int, prefix string) []memberDay {
		var out []memberDay
		for i := range n {
			out = append(out, memberDay{fmt.Sprintf("%s-%d", prefix, i), 1})
		}
		return out
	}
	for p := range int64(5) {
		k := cmpKey{"acme", "mau", p}
		s := c.exact([]cmpKey{k}, nil)[k]
		c.counted(k, s, countVersion{xmin: p + 1, members: 30}, days(30, "user"))
		if c.size > c.limit {
			t.Fatalf("after period %d: %d member days held, bound %d", p, c.size, c.limit)
		}
		if got := c.sets[k]; got != s {
			t.Fatalf("period %d: the set just written was dropped", p)
		}
	}
	total := 0
	for _, s := range c.sets {
		total += s.size()
	}
	if total != c.size {
		t.Fatalf("sets hold %d member days, the cache counts %d", total, c.size)
	}
	k := cmpKey{"acme", "mau", 4}
	s := c.exact([]cmpKey{k}, map[cmpKey]periodRow{k: {version: countVersion{xmin: 5, members: 30}}})[k]
	if s == nil {
		t.Fatal("the latest set is not exact at the version it was left with")
	}
	if in, on := s.held("user-7", 1); !in || !on {
		t.Fatalf("user-7 on day 1: in period %v, on day %v", in, on)
	}
	if in, on := s.held("user-7", 2); !in || on {
		t.Fatalf("user-7 on day 2: in period %v, on day %v", in, on)
	}
	if in, _ := s.held("user-30", 1); in {
		t.Fatal("user-30 was never counted")
	}
	if c.exact([]cmpKey{k}, map[cmpKey]periodRow{k: {version: countVersion{xmin: 6, members: 30}}})[k] != nil || c.sets[k] != nil {
		t.Fatal("a set whose period row changed is still used")
	}
	big := cmpKey{"globex", "mau", 1}
	c.counted(big, c.exact([]cmpKey{big}, nil)[big], countVersion{xmin: 9, members: 101}, days(101, "user"))
	if c.sets[big] != nil || c.size > c.limit {
		t.Fatalf("a set of 101 member days is kept under a bound of 100 (%d held)", c.size)
	}
}

// TestMemberSetAddsADayOnce: a member day added again (a hash collision
// answers a member's rows twice) is held once.
func TestMemberSetAddsADayOnce(t *testing.T) {
	s := newMemberSet()
	for range 2 {
		s.add(memberDay{"ann", 1})
		s.add(memberDay{"ann", 2})
	}
	if s.size() != 2 {
		t.Fatalf("ann on two days, each added twice: %d member days held", s.size())
	}
}

// BenchmarkMemberSetBytes reports what a remembered member day costs in
// memory: sets of 100,000 members of 10 characters, a tenth of them on a
// second day (docs/operations.md quotes it).
func BenchmarkMemberSetBytes(b *testing.B) {
	members := make([]string, 100_000)
	for i := range members {
		members[i] = fmt.Sprintf("user-%05d", i)
	}
	var perDay float64
	for range b.N {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		s := newMemberSet()
		for i, m := range members {
			s.add(memberDay{strings.Clone(m), 1})
			if i%10 == 0 {
				s.add(memberDay{strings.Clone(m), 2})
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		perDay = float64(after.HeapAlloc-before.HeapAlloc) / float64(s.size())
		runtime.KeepAlive(s)
	}
	b.ReportMetric(perDay, "bytes/member-day")
}
