package ingest

import "testing"

// Retention deletes from the head of a partition; compaction removes
// offsets anywhere above it. Only the part of a gap below the partition's
// first available offset is a loss (an offset jump); the rest is counted as
// compaction.
func TestSplitGapsTellsCompactionFromRetention(t *testing.T) {
	b := &microBatch{jumps: []jump{{from: 2, to: 5}, {from: 8, to: 12}, {from: 20, to: 23}}}
	lost := splitGaps(b, 10)
	if len(lost) != 2 || lost[0].from != 2 || lost[0].to != 5 || lost[1].from != 8 || lost[1].to != 10 {
		t.Fatalf("lost %+v, want [2,5) and [8,10)", lost)
	}
	if got := b.skipped[skipCompaction]; got != 2+3 {
		t.Errorf("compaction skipped %d offsets, want 5 ([10,12) and [20,23))", got)
	}
	b = &microBatch{jumps: []jump{{from: 20, to: 23}}}
	if lost := splitGaps(b, 0); len(lost) != 0 || b.skipped[skipCompaction] != 3 {
		t.Errorf("gap above the first offset: lost %+v, skipped %v", lost, b.skipped)
	}
}
