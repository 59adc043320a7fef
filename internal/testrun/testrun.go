// Package testrun runs a long-lived component (anything with a
// Run(ctx) error loop, such as the ingest consumer or the quota enforcer)
// in a test, stops it, and reads its Prometheus metrics and its log.
package testrun

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Service is a running component.
type Service struct {
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

// Start runs run in a goroutine until Stop (or the end of the test).
// reg is the registry the component registered its metrics with.
func Start(t testing.TB, reg *prometheus.Registry, run func(context.Context) error) *Service {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- run(ctx) }()
	t.Cleanup(func() { s.Stop(t) })
	return s
}

// Stop cancels the component and waits for Run to return; an error from
// Run, or Run not returning within 30s, fails the test. Stopping twice is
// a no-op.
func (s *Service) Stop(t testing.TB) {
	if s.cancel == nil {
		return
	}
	s.cancel()
	s.cancel = nil
	select {
	case err := <-s.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("Run did not return within 30s of its cancellation")
	}
}

// Metric sums the counters and gauges named name whose labels include
// labels (nil: all of them); -1 when the registry cannot be read.
func (s *Service) Metric(name string, labels map[string]string) float64 {
	mfs, err := s.reg.Gather()
	if err != nil {
		return -1
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue metrics
				}
			}
			switch {
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			}
		}
	}
	return sum
}
