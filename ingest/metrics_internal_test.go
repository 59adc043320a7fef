package ingest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Every counter an alert is written on is exported at 0 from the start,
// each label value it can take included: an alert on rate() or on a series
// being there must not wait for the first event.
func TestCountersAreExportedBeforeTheirFirstEvent(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := newMetrics(reg, "t"); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = map[string]bool{}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() != "topic" {
					got[mf.GetName()][l.GetValue()] = true
				}
			}
		}
	}
	for name, values := range map[string][]string{
		"tally_ingest_retries_total":         {"postgres", "refused"},
		"tally_ingest_anomalies_total":       {"offset_ahead_of_end", "offset_backwards", "aborted_transaction", "stalled_lock_holder_ended"},
		"tally_ingest_offsets_skipped_total": {"compaction", "transaction_commit", "transaction_abort"},
	} {
		for _, v := range values {
			if !got[name][v] {
				t.Errorf("%s{%s} not exported before its first event", name, v)
			}
		}
	}
}
